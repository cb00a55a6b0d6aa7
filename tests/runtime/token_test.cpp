#include <catch2/catch.hpp>

#include "node/node.h"

TEST_CASE("tokens compare equal only when identical", "[gate]") {
  auto b = [](const char* s) { return kj::StringPtr(s).asBytes(); };
  CHECK(troupe::tokensEqual(b("secret"), b("secret")));
  CHECK_FALSE(troupe::tokensEqual(b("secret"), b("secreT")));
  CHECK_FALSE(troupe::tokensEqual(b("secret"), b("secret2")));
  CHECK_FALSE(troupe::tokensEqual(b("secret"), b("")));
  CHECK(troupe::tokensEqual(b(""), b("")));
}

// Label selectors: every operator, the Kubernetes semantics for absent labels, canonical text and
// each parse error.

#include <catch2/catch.hpp>

#include "troupe/sched/selector.h"

using troupe::sched::Labels;
using troupe::sched::LabelSelector;

namespace {

const Labels kNode{{"group", "data_group"}, {"instance_type", "ml.c5.9xlarge"}, {"zone", "a"}};

}  // namespace

TEST_CASE("selector matches every operator", "[selector]") {
  struct Row {
    const char* text;
    bool matches;
  };
  const Row rows[] = {
      {"", true},
      {"group=data_group", true},
      {"group==data_group", true},
      {"group=dnn_group", false},
      {"group!=dnn_group", true},
      {"group!=data_group", false},
      {"missing!=x", true},  // absent labels satisfy != (Kubernetes)
      {"missing=x", false},
      {"instance_type in (ml.c5.9xlarge, ml.c5.18xlarge)", true},
      {"instance_type in (ml.c5.18xlarge)", false},
      {"instance_type notin (ml.c5.18xlarge)", true},
      {"instance_type notin (ml.c5.9xlarge,ml.c5.18xlarge)", false},
      {"missing notin (x)", true},
      {"missing in (x)", false},
      {"zone", true},
      {"missing", false},
      {"!missing", true},
      {"!zone", false},
      {"group=data_group,instance_type in (ml.c5.9xlarge, ml.c5.18xlarge)", true},
      {"group=data_group, !zone", false},
      {"  group = data_group ,zone  ", true},
  };
  for (const auto& row : rows) {
    INFO(row.text);
    auto parsed = LabelSelector::parse(row.text);
    REQUIRE(parsed);
    CHECK(parsed->matches(kNode) == row.matches);
  }
}

TEST_CASE("selector text is canonical and round-trips", "[selector]") {
  struct Row {
    const char* text;
    const char* canonical;
  };
  const Row rows[] = {
      {"", ""},
      {"a = b", "a=b"},
      {"a==b", "a=b"},
      {"a != b", "a!=b"},
      {"k in (c, a, b, a)", "k in (a, b, c)"},
      {"k notin(x)", "k notin (x)"},
      {" k ", "k"},
      {"! k", "!k"},
      {"group=data_group,instance_type in (ml.c5.9xlarge, ml.c5.18xlarge)",
       "group=data_group,instance_type in (ml.c5.18xlarge, ml.c5.9xlarge)"},
  };
  for (const auto& row : rows) {
    INFO(row.text);
    auto parsed = LabelSelector::parse(row.text);
    REQUIRE(parsed);
    CHECK(parsed->toText() == row.canonical);
    auto again = LabelSelector::parse(parsed->toText());
    REQUIRE(again);
    CHECK(*again == *parsed);
  }
}

TEST_CASE("selector parse errors point at the column", "[selector]") {
  struct Row {
    const char* text;
    const char* error;
  };
  const Row rows[] = {
      {"group=,x", "selector 'group=,x': expected a value at column 7"},
      {"group=", "selector 'group=': expected a value at column 7"},
      {"=x", "selector '=x': expected a key at column 1"},
      {"a=b,", "selector 'a=b,': expected a key at column 5"},
      {"!", "selector '!': expected a key at column 2"},
      {"k in (a,", "selector 'k in (a,': expected a value at column 9"},
      {"k in (a b)", "selector 'k in (a b)': expected ',' or ')' at column 9"},
      {"k in a", "selector 'k in a': expected '(' at column 6"},
      {"k ni (a)",
       "selector 'k ni (a)': expected '=', '!=', 'in', 'notin', ',' or the end at column 3"},
      {"a=b c", "selector 'a=b c': expected ',' or the end at column 5"},
      {"a=b;c", "selector 'a=b;c': expected ',' or the end at column 4"},
      {"k<3", "selector 'k<3': expected '=', '!=', 'in', 'notin', ',' or the end at column 2"},
  };
  for (const auto& row : rows) {
    INFO(row.text);
    auto parsed = LabelSelector::parse(row.text);
    REQUIRE_FALSE(parsed);
    CHECK(parsed.error == row.error);
  }
}

TEST_CASE("selector pins group values", "[selector]") {
  auto s = *LabelSelector::parse("group in (a, b, c), group notin (b), group=a");
  auto allowed = s.allowedValues("group");
  REQUIRE(allowed);
  CHECK(*allowed == std::vector<std::string>{"a"});
  CHECK_FALSE(LabelSelector::parse("zone=a")->allowedValues("group"));
}

// A starting point in the middle of a chain: on a plain class this would compile, call the static
// and return a placement without the group and the cpus.
#include <troupe/troupe.h>

troupe::Placement placement() {
#ifdef TROUPE_WRITTEN_RIGHT
  return troupe::Placement::group("cpu_pool").cpus(2).notGroup("x");
#else
  return troupe::Placement::group("cpu_pool").cpus(2).group("x");
#endif
}

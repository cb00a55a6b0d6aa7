// File: troupe/sched/sched.h
//
// The whole scheduler library in one include: instance table, resources, label selectors,
// Placement, ClusterView and the decision functions.

#pragma once

#include "troupe/sched/cluster_view.h"
#include "troupe/sched/decide.h"
#include "troupe/sched/instance_types.h"
#include "troupe/sched/placement.h"
#include "troupe/sched/resources.h"
#include "troupe/sched/selector.h"

// File: shared_source.h
//
// A dataset's file list, opened once per process (troupe/dataset/source.h): the driver that
// checks the dataset at start and the augmenters of the same process (one per vCPU) share it.
// Listing an ImageNet folder or indexing its shards is seconds of work and megabytes of paths.

#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "troupe/dataset/source.h"

namespace troupe::train {

// The dataset at `path`, opened by the first caller and kept while anyone holds it; its notes
// (files left out) are logged once, when it is opened. Throws SourceError (at open) and KJ's
// REQUIRE when `samples` exceeds the dataset. `folder`: read as an ImageFolder, whatever else
// lies beside its class folders (openImageFolder), not found from what is there (openSource).
std::shared_ptr<const data::Source> sharedSource(const std::string& path, uint64_t samples = 0,
                                                 bool folder = false);

}  // namespace troupe::train

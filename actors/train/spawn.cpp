// Spawning train.Augmenter actors (and growing them as data nodes join) and train.Trainer
// actors, one way for every driver (spawn.h).

#include "troupe/train/spawn.h"

#include <cstdio>

namespace troupe::train {
namespace {

// TrainerArgs' and AugmenterArgs' parts for a dataset: a sample as the transform writes it, and
// the epoch cut as torch's DataLoader cuts it.
void setSampleFormat(hetero::SampleFormat::Builder f, const images::Shape& shape,
                     images::Dtype dtype, uint32_t classes) {
  f.setChannels(shape.channels);
  f.setHeight(shape.height);
  f.setWidth(shape.width);
  f.setChannelsFirst(shape.channelsFirst);
  f.setDtype(static_cast<uint8_t>(dtype));
  f.setClasses(classes);
}

void setBatchedOrder(hetero::BatchOrder::Builder order, bool shuffle, bool dropLast, uint32_t rank,
                     uint32_t ranks, bool inOrder) {
  order.setBatched(true);
  order.setShuffle(shuffle);
  order.setDropLast(dropLast);
  order.setRank(rank);
  order.setRanks(ranks);
  order.setInOrder(inOrder);
}

}  // namespace

Placement augmenterPlacement(const AugmenterSpec& spec) {
  auto where = Placement::prefer(spec.dataGroup).cpus(spec.cpus);
  KJ_REQUIRE(spec.perNode > 0 || spec.cpus > 0,
             "augmenters that reserve no CPU need a count per node");
  return spec.perNode ? where.perNode(spec.perNode) : where.perVcpu();
}

SpawnOptions augmenterOptions(const AugmenterSpec& spec, std::string name) {
  auto options = SpawnOptions();
  // A DataLoader's: its nodes say how many workers they run, not each augmenter's start.
  if (spec.planned) options.quiet();
  return options.named(kj::mv(name))
      .unlinked()
      .restarts(spec.restarts, 60 * kj::SECONDS)
      .args<hetero::AugmenterArgs>([&](auto a) {
        a.setSeed(spec.seed);
        a.setBatchSize(spec.batchSize);
        a.setDataDir(spec.dataDir);
        a.setSamples(spec.samples);
        a.setDataset(spec.dataset);
        a.setTransform(spec.transform);
        a.setSkipBadSamples(spec.skipBadSamples);
        a.setMaxImagePixels(spec.maxImagePixels);
        a.setImageFolder(spec.imageFolder);
        a.setDecodeScaling(spec.decodeScaling);
        if (spec.batched) {
          auto order = a.initOrder();
          setBatchedOrder(order, spec.shuffle, spec.dropLast, 0, 1, false);
          order.setPlanned(spec.planned);
          if (spec.imageSeed) {
            order.setHasImageSeed(true);
            order.setImageSeed(*spec.imageSeed);
          }
        }
        a.setPython(spec.python);
        if (spec.python) {
          auto w = a.initWorkers();
          w.setLoader(spec.loader);
          w.setWorkers(spec.workers);
          w.setPrefetchFactor(spec.prefetchFactor);
          w.setSharedMemoryBytes(spec.sharedMemoryBytes);
          // Fetched from the trainer once per process, not carried by every augmenter.
          w.setFetched(!spec.pickled.empty());
        }
        auto aug = a.initAugment();
        const auto& c = spec.augment;
        aug.setPadding(c.padding);
        aug.setFlipProbability(c.flipProbability);
        aug.setMaxRotationDegrees(c.maxRotationDegrees);
        aug.setBrightness(c.brightness);
        aug.setContrast(c.contrast);
        aug.setBlurKernel(c.blurKernel);
        aug.setNoiseStddev(c.noiseStddev);
        aug.setUpscale(c.upscale);
        aug.setCropAreaMin(c.cropAreaMin);
      });
}

SpawnOptions trainerOptions(const TrainerSpec& spec, TrainerArgsFill own) {
  auto options = SpawnOptions();
  if (spec.quiet) options.quiet();
  return options.named(spec.name)
      .stopTimeout(spec.stopTimeout)
      .args<hetero::TrainerArgs>([&](hetero::TrainerArgs::Builder a) {
        a.setBatchSize(spec.batchSize);
        a.setSeed(spec.seed);
        a.setPrefetch(spec.prefetch);
        a.setSamplesSetting(spec.samplesSetting);
        a.setPython(spec.python);
        if (!spec.workerSpec.empty()) {
          a.setWorkerSpec(kj::arrayPtr(reinterpret_cast<const kj::byte*>(spec.workerSpec.data()),
                                       spec.workerSpec.size()));
        }
        if (spec.sample) {
          setSampleFormat(a.initSample(), spec.sample->shape, spec.sample->dtype,
                          spec.sample->classes);
        }
        if (spec.batched) {
          auto order = a.initOrder();
          setBatchedOrder(order, spec.shuffle, spec.dropLast, spec.rank, spec.ranks, spec.inOrder);
          order.setPlanned(spec.planned);
        }
        if (own) own(a);
      });
}

capnp::Request<hetero::Trainer::TrainParams, hetero::Trainer::TrainResults> trainRequest(
    Ref<hetero::Trainer>& trainer, uint32_t epochs, uint64_t samples,
    kj::ArrayPtr<Ref<hetero::Augmenter>> augmenters) {
  auto req = trainer.trainRequest();
  req.setEpochs(epochs);
  req.setTrainSamples(samples);
  auto sources = req.initSources(augmenters.size());
  for (size_t i = 0; i < augmenters.size(); ++i) augmenters[i].address().toProto(sources[i]);
  return req;
}

namespace {

// The augmenters in `ids` that run outside the data group now, retired from every trainer and
// stopped.
kj::Promise<void> moveBack(Driver& job, const AugmenterSpec& spec,
                           std::shared_ptr<std::vector<Ref<hetero::Trainer>>> trainers,
                           const std::vector<uint64_t>& ids, const std::string& joined) {
  std::vector<ActorAddress> outside;
  for (auto id : ids) {
    KJ_IF_MAYBE(a, job.current(id)) {
      if (a->group != spec.dataGroup) outside.push_back(*a);
    }
  }
  if (outside.empty()) return kj::READY_NOW;
  auto retired = kj::heapArrayBuilder<kj::Promise<void>>(trainers->size());
  for (auto& trainer : *trainers) {
    auto req = trainer.retireSourcesRequest();
    auto list = req.initIds(outside.size());
    for (size_t i = 0; i < outside.size(); ++i) list.set(i, outside[i].id);
    retired.add(req.send().ignoreResult());
  }
  return kj::joinPromises(retired.finish()).then([&job, outside, joined, spec]() {
    printf(
        "%zu augmenters outside %s (restarted on %s while it lacked room) stopped as %s "
        "joined: its augmenters take their place\n",
        outside.size(), spec.dataGroup.c_str(), outside.front().host.c_str(), joined.c_str());
    fflush(stdout);
    auto stops = kj::heapArrayBuilder<kj::Promise<void>>(outside.size());
    for (auto& a : outside) stops.add(job.stop(a.id));
    return kj::joinPromises(stops.finish());
  });
}

}  // namespace

void growOnJoin(Driver& job, const AugmenterSpec& spec, std::vector<Ref<hetero::Trainer>> trainers,
                kj::ArrayPtr<Ref<hetero::Augmenter>> augmenters, kj::TaskSet& tasks,
                AugmentersAdded added) {
  // (Ref copies only from a non-const Ref: the lambdas share one vector.)
  auto all = std::make_shared<std::vector<Ref<hetero::Trainer>>>(kj::mv(trainers));
  auto ids = std::make_shared<std::vector<uint64_t>>();
  for (auto& a : augmenters) ids->push_back(a.address().id);
  job.onNodeJoined([&job, spec, all, ids, &tasks, added](const NodeInfo& node) mutable {
    if (node.group() != spec.dataGroup.c_str()) return;
    std::string host = node.host().cStr();
    auto name = "augmenter-" + host + "." + std::to_string(node.incarnation());
    auto where = augmenterPlacement(spec).labels("host=" + host);
    tasks.add(job.spawnManyAsync<hetero::Augmenter>(where, augmenterOptions(spec, name))
                  .then([&job, spec, all, ids, host,
                         added](kj::Array<Ref<hetero::Augmenter>> refs) mutable {
                    printf("%zu augmenters placed on %s as it joined the job\n", refs.size(),
                           host.c_str());
                    fflush(stdout);
                    if (added) added(host, refs);
                    auto sends = kj::heapArrayBuilder<kj::Promise<void>>(all->size());
                    for (auto& trainer : *all) {
                      auto req = trainer.addSourcesRequest();
                      auto list = req.initSources(refs.size());
                      for (size_t i = 0; i < refs.size(); ++i) refs[i].address().toProto(list[i]);
                      sends.add(req.send().ignoreResult());
                    }
                    auto before = *ids;
                    for (auto& r : refs) ids->push_back(r.address().id);
                    return kj::joinPromises(sends.finish())
                        .then([&job, spec, all, before = kj::mv(before), host]() {
                          return moveBack(job, spec, all, before, host);
                        });
                  }));
  });
}

}  // namespace troupe::train

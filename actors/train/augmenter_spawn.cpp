#include "augmenter_spawn.h"

#include <cstdio>

namespace troupe::train {

void setSampleFormat(hetero::SampleFormat::Builder f, const images::Shape& shape,
                     images::Dtype dtype, uint32_t classes) {
  f.setChannels(shape.channels);
  f.setHeight(shape.height);
  f.setWidth(shape.width);
  f.setChannelsFirst(shape.channelsFirst);
  f.setDtype(static_cast<uint8_t>(dtype));
  f.setClasses(classes);
}

void setBatchedOrder(hetero::BatchOrder::Builder order, bool shuffle, bool dropLast,
                     uint32_t rank, uint32_t ranks, bool inOrder) {
  order.setBatched(true);
  order.setShuffle(shuffle);
  order.setDropLast(dropLast);
  order.setRank(rank);
  order.setRanks(ranks);
  order.setInOrder(inOrder);
}

Placement augmenterPlacement(const AugmenterSpec& spec) {
  auto where = Placement::prefer(spec.dataGroup);
  return spec.perNode ? where.perNode(spec.perNode) : where.perVcpu();
}

SpawnOptions augmenterOptions(const AugmenterSpec& spec, std::string name) {
  return SpawnOptions()
      .named(kj::mv(name))
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
        if (spec.batched) setBatchedOrder(a.initOrder(), spec.shuffle, spec.dropLast);
        a.setPython(spec.python);
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

void growOnJoin(Driver& job, const AugmenterSpec& spec, std::vector<Ref<hetero::Trainer>> trainers,
                kj::TaskSet& tasks, AugmentersAdded added) {
  // (Ref copies only from a non-const Ref: the lambdas share one vector.)
  auto all = std::make_shared<std::vector<Ref<hetero::Trainer>>>(kj::mv(trainers));
  job.onNodeJoined([&job, spec, all, &tasks, added](const NodeInfo& node) mutable {
    if (node.group() != spec.dataGroup.c_str()) return;
    std::string host = node.host().cStr();
    auto name = "augmenter-" + host + "." + std::to_string(node.incarnation());
    auto where = augmenterPlacement(spec).labels("host=" + host);
    tasks.add(job.spawnManyAsync<hetero::Augmenter>(where, augmenterOptions(spec, name))
                  .then([all, host, added](kj::Array<Ref<hetero::Augmenter>> refs) mutable {
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
                    return kj::joinPromises(sends.finish());
                  }));
  });
}

}  // namespace troupe::train

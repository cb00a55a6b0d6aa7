// centroids: a C++ actor app that trains on the user's own images without hetero_train
// (docs/data.md). A Centroids actor on each data node decodes and transforms its shard of the
// dataset (troupe/dataset/source.h, troupe/images/transforms.h) and sums each class's samples;
// the driver, on the dnn group, averages them into one centroid per class - a nearest-centroid
// classifier - checks that every sample was read once, and measures its accuracy on the test
// set.
//
//   troupe sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge \
//     -- build/centroids TRAIN TEST ['TRANSFORM']

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "images.capnp.h"
#include "troupe/dataset/epoch.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"
#include "troupe/troupe.h"

namespace {

const char* kTransform = "Resize(36),CenterCrop(32),Normalize(imagenet)";

uint64_t mix(uint64_t id) {  // splitmix64's finaliser
  uint64_t z = id + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One sample's values as floats.
std::vector<float> values(const troupe::data::Source& source,
                          const troupe::images::Pipeline& pipeline, size_t index, uint64_t seed,
                          int64_t& target) {
  int channels = source.encoding() == troupe::data::Encoding::kRawGrey8 ? 1 : 3;
  auto shape = pipeline.outputShape(channels);
  std::vector<uint8_t> bytes(shape.elements() * troupe::images::dtypeBytes(pipeline.dtype()));
  auto sample = source.read(index);
  pipeline.run(sample, source.encoding(), source.rawShape(), seed, bytes);
  std::vector<float> out(shape.elements());
  troupe::images::toFloat(bytes, pipeline.dtype(), out);
  target = sample.target;
  return out;
}

}  // namespace

class Centroids final : public troupe::ActorBase<images::Centroids> {
 public:
  using ActorBase::ActorBase;

  kj::Promise<void> sum(SumContext call) override {
    auto p = call.getParams();
    // Decoding is CPU work: the node's pool, not its event loop.
    struct Sums {
      uint64_t samples = 0, digest = 0;
      std::vector<double> sums;
      std::vector<uint64_t> counts;
      std::vector<std::string> skipped;
    };
    return context()
        .offload([dataset = std::string(p.getDataset()), spec = std::string(p.getTransform()),
                  shard = p.getShard(), shards = p.getShards(), seed = p.getSeed()]() {
          auto source = troupe::data::openSource(dataset);
          auto pipeline = troupe::images::Pipeline::parse(spec);
          Sums s;
          size_t classes = source->classes().size();
          s.counts.assign(classes, 0);
          for (auto id : troupe::data::shardIndices(source->size(), shard, shards)) {
            int64_t target = 0;
            std::vector<float> v;
            try {
              v = values(*source, pipeline, id, seed + id, target);
            } catch (const troupe::data::SampleError& e) {
              s.skipped.push_back(e.what());
              continue;
            }
            if (s.sums.empty()) s.sums.assign(classes * v.size(), 0);
            for (size_t k = 0; k < v.size(); ++k) s.sums[target * v.size() + k] += v[k];
            ++s.counts[target];
            ++s.samples;
            s.digest += mix(id);
          }
          return s;
        })
        .then([call](Sums s) mutable {
          auto r = call.getResults();
          r.setSamples(s.samples);
          r.setDigest(s.digest);
          auto sums = r.initSums(s.sums.size());
          for (size_t k = 0; k < s.sums.size(); ++k) sums.set(k, s.sums[k]);
          auto counts = r.initCounts(s.counts.size());
          for (size_t k = 0; k < s.counts.size(); ++k) counts.set(k, s.counts[k]);
          auto skipped = r.initSkipped(s.skipped.size());
          for (size_t k = 0; k < s.skipped.size(); ++k) skipped.set(k, s.skipped[k]);
        });
  }
};

int main(int argc, char* argv[]) {
  troupe::Registry types;
  types.add<Centroids>();
  return troupe::run(argc, argv, types, [](troupe::Driver& job) -> troupe::Co<void> {
    auto args = job.args();
    KJ_REQUIRE(args.size() >= 2, "usage: centroids TRAIN TEST ['TRANSFORM']");
    std::string train = args[0], test = args[1];
    std::string spec = args.size() > 2 ? args[2] : kTransform;
    // One per data node (the driver runs on the head, in the dnn group).
    auto actors =
        job.spawnMany<images::Centroids>(troupe::Placement::prefer("data_group").perNode(1));
    uint32_t shards = actors.size();
    std::vector<capnp::RemotePromise<images::Centroids::SumResults>> calls;
    for (uint32_t i = 0; i < shards; ++i) {
      auto req = actors[i].sumRequest();
      req.setDataset(train);
      req.setTransform(spec);
      req.setShard(i);
      req.setShards(shards);
      req.setSeed(42);
      calls.push_back(req.send());
      printf("centroids: shard %u of %u on %s\n", i, shards, actors[i].address().host.c_str());
    }
    std::vector<double> sums;
    std::vector<uint64_t> counts;
    uint64_t samples = 0, digest = 0;
    for (auto& call : calls) {
      auto r = co_await kj::mv(call);
      samples += r.getSamples();
      digest += r.getDigest();
      // Each getSums() counts against the message's traversal limit: read the lists once.
      auto shardSums = r.getSums();
      auto shardCounts = r.getCounts();
      if (sums.empty()) sums.assign(shardSums.size(), 0);
      if (counts.empty()) counts.assign(shardCounts.size(), 0);
      for (size_t k = 0; k < shardSums.size(); ++k) sums[k] += shardSums[k];
      for (size_t k = 0; k < shardCounts.size(); ++k) counts[k] += shardCounts[k];
      for (auto f : r.getSkipped()) printf("centroids: skipped %s\n", f.cStr());
    }
    // Every sample of the training set read once: the ids' digest, computed here.
    auto source = troupe::data::openSource(train);
    uint64_t expected = 0;
    for (size_t id = 0; id < source->size(); ++id) expected += mix(id);
    printf("centroids: %lu of %zu training samples, every one once: %s\n", (unsigned long)samples,
           source->size(), digest == expected ? "yes" : "NO");
    KJ_REQUIRE(digest == expected, "a training sample was read twice or not at all");
    size_t classes = counts.size(), dims = sums.size() / classes;
    for (size_t c = 0; c < classes; ++c) {
      for (size_t k = 0; k < dims; ++k) sums[c * dims + k] /= std::max<uint64_t>(1, counts[c]);
    }
    // The test set, here on the head: each sample's nearest centroid.
    auto testSource = troupe::data::openSource(test);
    auto pipeline = troupe::images::Pipeline::parse(spec);
    size_t right = 0;
    for (size_t i = 0; i < testSource->size(); ++i) {
      int64_t target = 0;
      auto v = values(*testSource, pipeline, i, i, target);
      size_t best = 0;
      double bestDistance = INFINITY;
      for (size_t c = 0; c < classes; ++c) {
        double d = 0;
        for (size_t k = 0; k < dims; ++k) d += std::pow(v[k] - sums[c * dims + k], 2);
        if (d < bestDistance) bestDistance = d, best = c;
      }
      right += best == size_t(target);
    }
    printf("centroids: %zu classes, test accuracy %.3f on %zu samples\n", classes,
           double(right) / testSource->size(), testSource->size());
    fflush(stdout);
  });
}

#include "troupe/dataset/fashion_mnist.h"

#include <catch2/catch.hpp>

#include "test_util.h"

using Catch::Matchers::Contains;
using troupe::data::DatasetError;
using troupe::data::loadFashionMnist;
using troupe::data::Split;
using troupe::test::idxBytes;
using troupe::test::TempDir;

TEST_CASE("loads a small gzipped split and its labels", "[dataset]") {
  TempDir dir;
  troupe::test::writeSplit(dir.path(), "train", 12);
  auto set = loadFashionMnist(dir.path(), Split::kTrain);
  CHECK(set.size() == 12);
  CHECK(set.rows == 28);
  CHECK(set.cols == 28);
  CHECK(set.pixels.size() == 12 * 784);
  CHECK(set.labels[11] == 1);
  CHECK(set.image(1)[0] == uint8_t(784 * 7));
}

TEST_CASE("accepts uncompressed files (SageMaker channel layout)", "[dataset]") {
  TempDir dir;
  troupe::test::writeSplit(dir.path(), "t10k", 5, 28, 28, /*gz=*/false);
  auto set = loadFashionMnist(dir.path(), Split::kTest);
  CHECK(set.size() == 5);
}

TEST_CASE("missing directory or file names what was looked for", "[dataset]") {
  TempDir dir;
  CHECK_THROWS_WITH(loadFashionMnist(dir / "nope", Split::kTrain),
                    Contains("train-images-idx3-ubyte.gz") && Contains("not a directory"));
  troupe::test::writeGzFile(dir / "train-images-idx3-ubyte.gz",
                            idxBytes({1, 28, 28}, std::vector<uint8_t>(784)));
  CHECK_THROWS_WITH(loadFashionMnist(dir.path(), Split::kTrain),
                    Contains("train-labels-idx1-ubyte"));
}

TEST_CASE("label count must equal image count", "[dataset]") {
  TempDir dir;
  troupe::test::writeGzFile(dir / "train-images-idx3-ubyte.gz",
                            idxBytes({3, 28, 28}, std::vector<uint8_t>(3 * 784)));
  troupe::test::writeGzFile(dir / "train-labels-idx1-ubyte.gz",
                            idxBytes({2}, std::vector<uint8_t>(2)));
  CHECK_THROWS_WITH(loadFashionMnist(dir.path(), Split::kTrain),
                    Contains("train-labels-idx1-ubyte.gz has 2 labels but "
                             "train-images-idx3-ubyte.gz has 3 images"));
}

TEST_CASE("truncated files are reported with expected and actual sizes", "[dataset]") {
  TempDir dir;
  auto bytes = idxBytes({4, 28, 28}, std::vector<uint8_t>(4 * 784));
  bytes.resize(bytes.size() - 100);
  const auto plain = dir / "plain-idx3";
  troupe::test::writeFile(plain, bytes);
  CHECK_THROWS_WITH(troupe::data::readIdxFile(plain, 3),
                    Contains("truncated") && Contains("4x28x28 = 3136") && Contains("3036"));

  // A gzip stream cut in the middle: zlib notices the missing end of stream.
  const auto gz = dir / "cut.gz";
  troupe::test::writeGzFile(gz, idxBytes({4, 28, 28}, std::vector<uint8_t>(4 * 784, 3)));
  std::filesystem::resize_file(gz, std::filesystem::file_size(gz) / 2);
  CHECK_THROWS_WITH(troupe::data::readIdxFile(gz, 3), Contains("cut.gz") && Contains("truncated"));

  const auto tiny = dir / "tiny";
  troupe::test::writeFile(tiny, {0, 0});
  CHECK_THROWS_WITH(troupe::data::readIdxFile(tiny, 1), Contains("truncated"));
}

TEST_CASE("bad magic, trailing bytes and label range are rejected", "[dataset]") {
  TempDir dir;
  const auto labels = dir / "labels";
  troupe::test::writeFile(labels, idxBytes({2}, {1, 2}));
  CHECK_THROWS_WITH(troupe::data::readIdxFile(labels, 3),
                    Contains("bad magic number 0x00000801") && Contains("0x00000803"));
  auto extra = idxBytes({2}, {1, 2});
  extra.push_back(9);
  troupe::test::writeFile(labels, extra);
  CHECK_THROWS_WITH(troupe::data::readIdxFile(labels, 1), Contains("1 unexpected bytes"));

  troupe::test::writeSplit(dir.path(), "train", 3);
  troupe::test::writeGzFile(dir / "train-labels-idx1-ubyte.gz", idxBytes({3}, {0, 10, 1}));
  CHECK_THROWS_WITH(loadFashionMnist(dir.path(), Split::kTrain),
                    Contains("label 1 is 10") && Contains("0..9"));
}

TEST_CASE("the installed Fashion-MNIST loads", "[dataset][real]") {
  if (!std::filesystem::exists(troupe::data::kDefaultFashionMnistDir)) {
    WARN("skipping: dataset-fashion-mnist is not installed");
    return;
  }
  auto train = loadFashionMnist(troupe::data::kDefaultFashionMnistDir, Split::kTrain);
  auto test = loadFashionMnist(troupe::data::kDefaultFashionMnistDir, Split::kTest);
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  CHECK(train.imageSize() == 784);
  std::vector<int> perClass(10);
  for (uint8_t l : test.labels) ++perClass[l];
  for (int n : perClass) CHECK(n == 1000);  // The test set is balanced.
}

TEST_CASE("gatherSamples copies images and labels in order", "[dataset]") {
  TempDir dir;
  troupe::test::writeSplit(dir.path(), "train", 6);
  auto set = loadFashionMnist(dir.path(), Split::kTrain);
  std::vector<uint32_t> ids = {5, 0, 3};
  auto batch = troupe::data::gatherSamples(set, ids);
  REQUIRE(batch.size() == 3);
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(batch.labels[i] == set.labels[ids[i]]);
    CHECK(std::equal(batch.image(i).begin(), batch.image(i).end(), set.image(ids[i]).begin()));
  }
  std::vector<uint32_t> bad = {6};
  CHECK_THROWS_AS(troupe::data::gatherSamples(set, bad), DatasetError);
}

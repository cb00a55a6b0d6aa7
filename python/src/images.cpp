// troupe._native's datasets and image transforms (docs/data.md): a source opened from a path
// (ImageFolder, manifest, WebDataset shards, IDX) and a transform spec run by the C++ pipeline,
// for a script that reads its data in its own process, and for checking the pipeline against
// torchvision's (tests/python/transforms_check.py).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"

namespace py = pybind11;

namespace {

using troupe::images::Dtype;
using troupe::images::Pipeline;

py::array shaped(const troupe::images::Shape& s, Dtype dtype) {
  std::vector<py::ssize_t> dims = s.channelsFirst
                                      ? std::vector<py::ssize_t>{s.channels, s.height, s.width}
                                      : std::vector<py::ssize_t>{s.height, s.width, s.channels};
  if (dtype == Dtype::kUint8) return py::array_t<uint8_t>(dims);
  if (dtype == Dtype::kFloat16) return py::array(py::dtype("float16"), dims);
  return py::array_t<float>(dims);
}

std::span<uint8_t> bytesOf(py::array& a) {
  return {static_cast<uint8_t*>(a.mutable_data()), size_t(a.nbytes())};
}

}  // namespace

void bindImages(py::module_& m) {
  py::class_<troupe::data::Source, std::shared_ptr<troupe::data::Source>>(m, "Source")
      .def("__len__", &troupe::data::Source::size)
      .def_property_readonly("classes", &troupe::data::Source::classes)
      .def_property_readonly("kind", &troupe::data::Source::kind)
      .def("name", &troupe::data::Source::nameOf, py::arg("index"))
      .def_property_readonly("notes", &troupe::data::Source::notes,
                             "What opening it left out or found odd, one line each (files that "
                             "are not images, a shard cut short).")
      .def(
          "read",
          [](const troupe::data::Source& s, size_t i) {
            if (i >= s.size())
              throw py::index_error("sample " + std::to_string(i) + " of " +
                                    std::to_string(s.size()));
            auto e = s.read(i);
            return py::make_tuple(
                py::bytes(reinterpret_cast<const char*>(e.bytes.data()), e.bytes.size()), e.target);
          },
          py::arg("index"), "The sample's encoded bytes and its target.");
  m.def(
      "open_image_folder",
      [](std::string path) {
        return std::shared_ptr<troupe::data::Source>(troupe::data::openImageFolder(path));
      },
      py::arg("root"),
      "Class folders at root as troupe's ImageFolder lists them, whatever lies beside them.");
  m.def(
      "open_dataset",
      [](std::string path) {
        return std::shared_ptr<troupe::data::Source>(troupe::data::openSource(path));
      },
      py::arg("path"),
      "An ImageFolder, a manifest, WebDataset shards or Fashion-MNIST's IDX files, found from what "
      "is "
      "at the path (docs/data.md).");

  py::class_<Pipeline>(m, "Transform")
      .def(py::init([](std::string spec) { return Pipeline::parse(spec); }), py::arg("spec"))
      .def("__repr__", [](const Pipeline& p) { return "Transform('" + p.describe() + "')"; })
      .def_property("decode_scaling", &Pipeline::decodeScaling, &Pipeline::setDecodeScaling,
                    "JPEGs decoded at a DCT scale where the first resize shrinks them to half or "
                    "less (on by default for troupe's own specs; other pixels than PIL's).")
      .def_property("max_pixels", &Pipeline::maxPixels, &Pipeline::setMaxPixels,
                    "An image whose header claims more pixels is refused before it is decoded "
                    "(PIL's limit by default; 0: none).")
      .def_property_readonly("dtype",
                             [](const Pipeline& p) { return troupe::images::dtypeName(p.dtype()); })
      .def(
          "shape",
          [](const Pipeline& p, int channels) {
            auto s = p.outputShape(channels);
            return s.channelsFirst ? py::make_tuple(s.channels, s.height, s.width)
                                   : py::make_tuple(s.height, s.width, s.channels);
          },
          py::arg("channels") = 3)
      .def(
          "__call__",
          [](const Pipeline& p, py::bytes encoded, uint64_t seed, std::string name) {
            std::string text = encoded;
            troupe::data::Encoded sample{std::vector<uint8_t>(text.begin(), text.end()), 0, name};
            auto out = shaped(p.outputShape(3), p.dtype());
            auto dst = bytesOf(out);
            {
              py::gil_scoped_release release;
              p.run(sample, troupe::data::Encoding::kFile, {}, seed, dst);
            }
            return out;
          },
          py::arg("encoded"), py::arg("seed") = 0, py::arg("name") = "<bytes>",
          "Decodes an image file's bytes (as RGB) and transforms them.")
      .def(
          "image",
          [](const Pipeline& p, py::array_t<uint8_t, py::array::c_style> hwc, uint64_t seed) {
            if (hwc.ndim() != 3 || (hwc.shape(2) != 1 && hwc.shape(2) != 3)) {
              throw py::value_error("image: an (H, W, 1) or (H, W, 3) uint8 array");
            }
            troupe::images::Image im;
            im.height = int(hwc.shape(0));
            im.width = int(hwc.shape(1));
            im.channels = int(hwc.shape(2));
            im.pixels.assign(hwc.data(), hwc.data() + hwc.size());
            auto done = p.transform(std::move(im), seed);
            py::array_t<uint8_t> out(
                std::vector<py::ssize_t>{done.height, done.width, done.channels});
            std::copy(done.pixels.begin(), done.pixels.end(), out.mutable_data());
            return out;
          },
          py::arg("hwc"), py::arg("seed") = 0,
          "The transforms before ToTensor/Normalize on a decoded (H, W, C) uint8 image.");
}

// The transform spec (troupe/images/transforms.h): "Name(args),Name(args),...", with
// torchvision's names and arguments, positional or by name; numbers, tuples "(a, b)" or
// "[a, b]", None, True/False and names (imagenet, float16). Every error names the transform,
// the argument, the value and what is allowed.

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <sstream>

#include "ops.h"

namespace troupe::images {

namespace {

struct Value {
  enum Type { kNumber, kName, kTuple, kNone } type = kNone;
  double number = 0;
  bool integer = false;
  std::string name;
  std::vector<Value> items;
  std::string text;  // as written
};

struct Call {
  std::string name;
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  size_t position = 0;  // 1-based, in the spec
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  std::vector<Call> calls() {
    std::vector<Call> out;
    skip();
    if (at_ == s_.size()) throw SpecError("the transform spec is empty: " + allowed());
    while (true) {
      out.push_back(call(out.size() + 1));
      skip();
      if (at_ == s_.size()) break;
      expect(',');
      skip();
    }
    return out;
  }

 private:
  Call call(size_t position) {
    Call c;
    c.position = position;
    c.name = identifier();
    if (c.name.empty()) fail("a transform name");
    skip();
    if (at_ == s_.size() || s_[at_] != '(') {
      throw SpecError("transform " + std::to_string(position) + " '" + c.name +
                      "' needs its arguments in parentheses: " + c.name + "(...)");
    }
    ++at_;
    skip();
    if (peek() == ')') {
      ++at_;
      return c;
    }
    while (true) {
      skip();
      size_t start = at_;
      auto name = identifier();
      skip();
      if (!name.empty() && peek() == '=') {
        ++at_;
        skip();
        c.named.emplace_back(name, value());
      } else {
        at_ = start;
        if (!c.named.empty()) {
          throw SpecError(c.name + ": a positional argument after a named one, at '" +
                          s_.substr(start, 20) + "'");
        }
        c.positional.push_back(value());
      }
      skip();
      if (peek() == ')') {
        ++at_;
        return c;
      }
      expect(',');
    }
  }

  Value value() {
    Value v;
    size_t start = at_;
    char c = peek();
    if (c == '(' || c == '[') {
      char close = c == '(' ? ')' : ']';
      ++at_;
      v.type = Value::kTuple;
      skip();
      while (peek() != close) {
        v.items.push_back(value());
        skip();
        if (peek() == ',') {
          ++at_;
          skip();
        } else if (peek() != close) {
          fail(std::string("',' or '") + close + "'");
        }
      }
      ++at_;
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.') {
      size_t used = 0;
      try {
        v.number = std::stod(s_.substr(at_), &used);
      } catch (const std::exception&) {
        fail("a number");
      }
      auto text = s_.substr(at_, used);
      v.integer = text.find_first_of(".eE") == std::string::npos;
      v.type = Value::kNumber;
      at_ += used;
    } else {
      v.name = identifier();
      if (v.name.empty()) fail("a value");
      v.type = v.name == "None" ? Value::kNone : Value::kName;
    }
    v.text = s_.substr(start, at_ - start);
    return v;
  }

  std::string identifier() {
    size_t start = at_;
    while (at_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[at_])) || s_[at_] == '_')) {
      ++at_;
    }
    return s_.substr(start, at_ - start);
  }
  char peek() const { return at_ < s_.size() ? s_[at_] : '\0'; }
  void skip() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_]))) ++at_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("'") + c + "'");
    ++at_;
  }
  [[noreturn]] void fail(const std::string& wanted) {
    throw SpecError("transform spec: expected " + wanted + " at character " +
                    std::to_string(at_ + 1) + " of '" + s_ + "'" +
                    (at_ < s_.size() ? " (found '" + s_.substr(at_, 12) + "')" : " (at its end)"));
  }

 public:
  static std::string allowed();

 private:
  const std::string& s_;
  size_t at_ = 0;
};

const std::vector<std::pair<std::string, std::vector<std::string>>>& signatures() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kAll = {
      {"Resize", {"size"}},
      {"CenterCrop", {"size"}},
      {"RandomResizedCrop", {"size", "scale", "ratio"}},
      {"RandomHorizontalFlip", {"p"}},
      {"RandomVerticalFlip", {"p"}},
      {"ColorJitter", {"brightness", "contrast", "saturation", "hue"}},
      {"RandomAffine", {"degrees", "translate", "scale", "shear"}},
      {"GaussianBlur", {"kernel_size", "sigma"}},
      {"Grayscale", {"num_output_channels"}},
      {"ToTensor", {}},
      {"Normalize", {"mean", "std"}},
      {"ToDtype", {"dtype"}},
      {"ChannelsLast", {}},
  };
  return kAll;
}

std::string Parser::allowed() {
  std::string out = "the transforms are ";
  bool first = true;
  for (auto& [name, args] : signatures()) {
    out += (first ? "" : ", ") + name;
    first = false;
  }
  return out;
}

size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                  std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Binds a call's arguments to its transform's names: each name once, none unknown.
class Args {
 public:
  Args(const Call& c, const std::vector<std::string>& names) : call_(c), names_(names) {
    if (c.positional.size() > names.size()) {
      throw SpecError(c.name + " takes at most " + std::to_string(names.size()) +
                      " argument(s) (" + list() + "), not " + std::to_string(c.positional.size()));
    }
    for (size_t i = 0; i < c.positional.size(); ++i) given_[names[i]] = &c.positional[i];
    for (auto& [name, v] : c.named) {
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        throw SpecError(c.name + " has no argument '" + name + "'; " +
                        (names.empty() ? "it takes none" : "its arguments: " + list()));
      }
      if (given_.count(name)) throw SpecError(c.name + ": '" + name + "' given twice");
      given_[name] = &v;
    }
  }

  const Value* get(const std::string& name) const {
    auto it = given_.find(name);
    return it == given_.end() || it->second->type == Value::kNone ? nullptr : it->second;
  }
  const Value& require(const std::string& name) const {
    auto* v = get(name);
    if (!v) throw SpecError(call_.name + " needs '" + name + "' (" + list() + ")");
    return *v;
  }
  [[noreturn]] void bad(const std::string& name, const Value& v, const std::string& allowed) const {
    throw SpecError(call_.name + ": " + name + "=" + v.text + " is not allowed: " + allowed);
  }

  double number(const std::string& name, const Value& v, double lo, double hi) const {
    if (v.type != Value::kNumber || v.number < lo || v.number > hi) {
      bad(name, v, "a number from " + fmt(lo) + " to " + fmt(hi));
    }
    return v.number;
  }
  // A size: an int, or (h, w).
  std::pair<int, int> size(const std::string& name, bool& single) const {
    auto& v = require(name);
    auto ok = [](const Value& x) { return x.type == Value::kNumber && x.integer && x.number >= 1 && x.number <= 16384; };
    if (ok(v)) {
      single = true;
      return {int(v.number), int(v.number)};
    }
    if (v.type == Value::kTuple && v.items.size() == 1 && ok(v.items[0])) {
      single = true;
      return {int(v.items[0].number), int(v.items[0].number)};
    }
    if (v.type == Value::kTuple && v.items.size() == 2 && ok(v.items[0]) && ok(v.items[1])) {
      single = false;
      return {int(v.items[0].number), int(v.items[1].number)};
    }
    bad(name, v, "an integer from 1 to 16384, or (height, width)");
  }
  // A range: (min, max) within [lo, hi], or a number x: [center - x, center + x] clipped to lo.
  Range range(const std::string& name, double center, double lo, double hi, bool symmetric) const {
    auto* v = get(name);
    if (!v) return Range{};
    if (v->type == Value::kNumber) {
      double x = number(name, *v, 0, hi);
      return symmetric ? Range{std::max(lo, center - x), center + x, true} : Range{lo, x, true};
    }
    if (v->type == Value::kTuple && v->items.size() == 2) {
      double a = number(name, v->items[0], lo, hi), b = number(name, v->items[1], lo, hi);
      if (a > b) bad(name, *v, "(min, max) with min <= max");
      return Range{a, b, true};
    }
    bad(name, *v, "a number, or (min, max) from " + fmt(lo) + " to " + fmt(hi));
  }

 private:
  std::string list() const {
    std::string out;
    for (auto& n : names_) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? "none" : out;
  }
  const Call& call_;
  const std::vector<std::string>& names_;
  std::map<std::string, const Value*> given_;
};

std::vector<float> floats(const Args& a, const std::string& name, const Value& v) {
  std::vector<float> out;
  if (v.type == Value::kNumber) return {float(v.number)};
  if (v.type != Value::kTuple || v.items.empty() || v.items.size() > 4) {
    a.bad(name, v, "one number per channel, as (0.485, 0.456, 0.406)");
  }
  for (auto& x : v.items) out.push_back(float(a.number(name, x, -1e6, 1e6)));
  return out;
}

Op makeOp(const Call& c, const std::vector<std::string>& names, Kind kind) {
  Args a(c, names);
  Op op;
  op.kind = kind;
  bool single = false;
  switch (kind) {
    case Kind::kResize: {
      auto [h, w] = a.size("size", single);
      op.height = h;
      op.width = w;
      op.shorterSide = single;
      op.text = single ? "Resize(size=" + std::to_string(h) + ")"
                       : "Resize(size=(" + std::to_string(h) + ", " + std::to_string(w) + "))";
      break;
    }
    case Kind::kCenterCrop:
    case Kind::kRandomResizedCrop: {
      auto [h, w] = a.size("size", single);
      op.height = h;
      op.width = w;
      std::string size = "size=(" + std::to_string(h) + ", " + std::to_string(w) + ")";
      if (kind == Kind::kCenterCrop) {
        op.text = "CenterCrop(" + size + ")";
        break;
      }
      if (a.get("scale")) op.scale = a.range("scale", 0, 1e-6, 1, false);
      if (a.get("ratio")) op.ratio = a.range("ratio", 0, 1e-3, 1e3, false);
      if (a.get("scale") && a.get("scale")->type != Value::kTuple) {
        a.bad("scale", *a.get("scale"), "(min, max) area fractions, as (0.08, 1.0)");
      }
      if (a.get("ratio") && a.get("ratio")->type != Value::kTuple) {
        a.bad("ratio", *a.get("ratio"), "(min, max) aspect ratios, as (0.75, 1.3333)");
      }
      op.text = "RandomResizedCrop(" + size + ", scale=(" + fmt(op.scale.min) + ", " +
                fmt(op.scale.max) + "), ratio=(" + fmt(op.ratio.min) + ", " + fmt(op.ratio.max) + "))";
      break;
    }
    case Kind::kRandomHorizontalFlip:
    case Kind::kRandomVerticalFlip:
      if (auto* v = a.get("p")) op.p = a.number("p", *v, 0, 1);
      op.text = c.name + "(p=" + fmt(op.p) + ")";
      break;
    case Kind::kColorJitter:
      op.brightness = a.range("brightness", 1, 0, 1e3, true);
      op.contrast = a.range("contrast", 1, 0, 1e3, true);
      op.saturation = a.range("saturation", 1, 0, 1e3, true);
      if (auto* v = a.get("hue")) {
        op.hue = v->type == Value::kNumber ? Range{-a.number("hue", *v, 0, 0.5), v->number, true}
                                           : a.range("hue", 0, -0.5, 0.5, false);
      }
      op.text = "ColorJitter(";
      for (auto [name, r] : {std::pair<const char*, Range>{"brightness", op.brightness},
                             {"contrast", op.contrast},
                             {"saturation", op.saturation},
                             {"hue", op.hue}}) {
        if (!r.set) continue;
        op.text += std::string(op.text.back() == '(' ? "" : ", ") + name + "=(" + fmt(r.min) +
                   ", " + fmt(r.max) + ")";
      }
      op.text += ")";
      break;
    case Kind::kRandomAffine: {
      auto& d = a.require("degrees");
      op.degrees = d.type == Value::kNumber ? Range{-a.number("degrees", d, 0, 360), d.number, true}
                                            : a.range("degrees", 0, -360, 360, false);
      // As torchvision reads them: translate (a, b), the largest fractions of the width and the
      // height, each from 0 to 1 (kept in translate.min and .max); scale (min, max), a pair only;
      // shear a number s (x in (-s, s)), (min, max) of x, or (xmin, xmax, ymin, ymax).
      if (auto* v = a.get("translate")) {
        if (v->type != Value::kTuple || v->items.size() != 2) {
          a.bad("translate", *v, "(a, b): the largest fractions of the width and the height");
        }
        op.translate = Range{a.number("translate", v->items[0], 0, 1),
                             a.number("translate", v->items[1], 0, 1), true};
      }
      if (auto* v = a.get("scale")) {
        if (v->type != Value::kTuple) a.bad("scale", *v, "(min, max), as torchvision's: a pair");
        op.affineScale = a.range("scale", 0, 1e-3, 10, false);
      }
      if (auto* v = a.get("shear")) {
        if (v->type == Value::kTuple && v->items.size() == 4) {
          auto pair = [&](size_t at) {
            double lo = a.number("shear", v->items[at], -89, 89);
            double hi = a.number("shear", v->items[at + 1], -89, 89);
            if (lo > hi) a.bad("shear", *v, "(xmin, xmax, ymin, ymax), each min <= max");
            return Range{lo, hi, true};
          };
          op.shear = pair(0);
          op.shearY = pair(2);
        } else {
          op.shear = v->type == Value::kNumber
                         ? Range{-a.number("shear", *v, 0, 89), v->number, true}
                         : a.range("shear", 0, -89, 89, false);
        }
      }
      auto pair = [](const Range& r) { return "(" + fmt(r.min) + ", " + fmt(r.max) + ")"; };
      op.text = "RandomAffine(degrees=" + pair(op.degrees) +
                (op.translate.set ? ", translate=" + pair(op.translate) : "") +
                (op.affineScale.set ? ", scale=" + pair(op.affineScale) : "") +
                (op.shearY.set ? ", shear=(" + fmt(op.shear.min) + ", " + fmt(op.shear.max) + ", " +
                                     fmt(op.shearY.min) + ", " + fmt(op.shearY.max) + ")"
                 : op.shear.set ? ", shear=" + pair(op.shear)
                                : "") +
                ")";
      break;
    }
    case Kind::kGaussianBlur: {
      auto [kx, ky] = a.size("kernel_size", single);  // torchvision's (x, y): width first
      if (kx % 2 == 0 || ky % 2 == 0 || kx > 99 || ky > 99) {
        a.bad("kernel_size", a.require("kernel_size"), "odd sizes from 1 to 99");
      }
      op.kernelX = kx;
      op.kernelY = ky;
      if (auto* v = a.get("sigma")) {
        op.sigma = v->type == Value::kNumber ? Range{a.number("sigma", *v, 1e-3, 100), v->number, true}
                                             : a.range("sigma", 0, 1e-3, 100, false);
      }
      op.text = "GaussianBlur(kernel_size=(" + std::to_string(kx) + ", " + std::to_string(ky) +
                "), sigma=(" + fmt(op.sigma.min) + ", " + fmt(op.sigma.max) + "))";
      break;
    }
    case Kind::kGrayscale:
      if (auto* v = a.get("num_output_channels")) {
        if (v->type != Value::kNumber || (v->number != 1 && v->number != 3)) {
          a.bad("num_output_channels", *v, "1 or 3");
        }
        op.grayChannels = int(v->number);
      }
      op.text = "Grayscale(num_output_channels=" + std::to_string(op.grayChannels) + ")";
      break;
    case Kind::kNormalize: {
      auto& m = a.require("mean");
      if (m.type == Value::kName) {
        if (m.name != "imagenet") a.bad("mean", m, "numbers, or imagenet");
        if (a.get("std")) throw SpecError("Normalize(imagenet) takes no std: imagenet sets both");
        op.mean = {0.485f, 0.456f, 0.406f};
        op.stddev = {0.229f, 0.224f, 0.225f};
      } else {
        op.mean = floats(a, "mean", m);
        op.stddev = floats(a, "std", a.require("std"));
        if (op.mean.size() != op.stddev.size()) {
          throw SpecError("Normalize: " + std::to_string(op.mean.size()) + " mean(s) but " +
                          std::to_string(op.stddev.size()) + " std(s): one of each per channel");
        }
        for (float s : op.stddev) {
          if (!(s > 0)) throw SpecError("Normalize: every std must be above 0, not " + fmt(s));
        }
      }
      op.text = "Normalize(mean=(";
      for (size_t i = 0; i < op.mean.size(); ++i) op.text += (i ? ", " : "") + fmt(op.mean[i]);
      op.text += "), std=(";
      for (size_t i = 0; i < op.stddev.size(); ++i) op.text += (i ? ", " : "") + fmt(op.stddev[i]);
      op.text += "))";
      break;
    }
    case Kind::kToDtype: {
      auto& d = a.require("dtype");
      std::string name = d.type == Value::kName ? d.name : "";
      if (name.rfind("torch", 0) == 0) name = name.substr(5);
      if (name == "float16" || name == "half") {
        op.dtype = Dtype::kFloat16;
      } else if (name == "float32" || name == "float") {
        op.dtype = Dtype::kFloat32;
      } else {
        a.bad("dtype", d, "float16 or float32 (after ToTensor or Normalize)");
      }
      op.text = std::string("ToDtype(dtype=") + dtypeName(op.dtype) + ")";
      break;
    }
    case Kind::kToTensor:
    case Kind::kChannelsLast:
      op.text = c.name + "()";
      break;
  }
  return op;
}

}  // namespace

std::vector<Op> parseSpec(const std::string& spec) {
  static const std::map<std::string, Kind> kKinds = {
      {"Resize", Kind::kResize},
      {"CenterCrop", Kind::kCenterCrop},
      {"RandomResizedCrop", Kind::kRandomResizedCrop},
      {"RandomHorizontalFlip", Kind::kRandomHorizontalFlip},
      {"RandomVerticalFlip", Kind::kRandomVerticalFlip},
      {"ColorJitter", Kind::kColorJitter},
      {"RandomAffine", Kind::kRandomAffine},
      {"GaussianBlur", Kind::kGaussianBlur},
      {"Grayscale", Kind::kGrayscale},
      {"ToTensor", Kind::kToTensor},
      {"Normalize", Kind::kNormalize},
      {"ToDtype", Kind::kToDtype},
      {"ChannelsLast", Kind::kChannelsLast},
  };
  std::vector<Op> ops;
  for (auto& call : Parser(spec).calls()) {
    auto kind = kKinds.find(call.name);
    if (kind == kKinds.end()) {
      std::string best;
      size_t bestDistance = 1000;
      for (auto& [name, args] : signatures()) {
        auto d = distance(call.name, name);
        if (d < bestDistance) {
          bestDistance = d;
          best = name;
        }
      }
      throw SpecError("unknown transform '" + call.name + "' (transform " +
                      std::to_string(call.position) + " of the spec)" +
                      (bestDistance <= 4 ? "; did you mean " + best + "?" : "") + " " +
                      Parser::allowed());
    }
    for (auto& [name, args] : signatures()) {
      if (name == call.name) ops.push_back(makeOp(call, args, kind->second));
    }
  }
  return ops;
}

}  // namespace troupe::images

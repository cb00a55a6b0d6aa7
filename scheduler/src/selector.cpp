#include "troupe/sched/selector.h"

#include <algorithm>

#include "text_cursor.h"

namespace troupe::sched {

using detail::ParseError;
using detail::TextCursor;

bool isNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '/';
}

bool LabelSelector::Requirement::matches(const Labels& labels) const {
  auto it = labels.find(key);
  bool has = it != labels.end();
  switch (op) {
    case Op::EQUALS:
      return has && it->second == values[0];
    case Op::NOT_EQUALS:
      return !has || it->second != values[0];
    case Op::IN:
      return has && std::binary_search(values.begin(), values.end(), it->second);
    case Op::NOT_IN:
      return !has || !std::binary_search(values.begin(), values.end(), it->second);
    case Op::EXISTS:
      return has;
    case Op::NOT_EXISTS:
      return !has;
  }
  return false;
}

bool LabelSelector::matches(const Labels& labels) const {
  for (const auto& r : requirements_) {
    if (!r.matches(labels)) return false;
  }
  return true;
}

LabelSelector& LabelSelector::add(Requirement requirement) {
  auto& v = requirement.values;
  if (requirement.op == Op::IN || requirement.op == Op::NOT_IN) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  requirements_.push_back(std::move(requirement));
  return *this;
}

namespace {

std::vector<std::string> parseValueList(TextCursor& in) {
  in.expect("(");
  std::vector<std::string> values;
  do {
    values.push_back(in.requireName("a value"));
  } while (in.consume(","));
  if (!in.consume(")")) in.fail("expected ',' or ')'");
  return values;
}

LabelSelector::Requirement parseRequirement(TextCursor& in) {
  using Op = LabelSelector::Op;
  if (in.consume("!")) return {in.requireName("a key"), Op::NOT_EXISTS, {}};
  std::string key = in.requireName("a key");
  if (in.consume("!=")) return {key, Op::NOT_EQUALS, {in.requireName("a value")}};
  if (in.consume("==") || in.consume("=")) return {key, Op::EQUALS, {in.requireName("a value")}};
  size_t wordAt = in.position();
  std::string_view word = in.name();
  if (word == "in") return {key, Op::IN, parseValueList(in)};
  if (word == "notin") return {key, Op::NOT_IN, parseValueList(in)};
  if (!word.empty() || (in.peek() != ',' && !in.atEnd())) {
    in.setPosition(wordAt);
    in.fail("expected '=', '!=', 'in', 'notin', ',' or the end");
  }
  return {key, Op::EXISTS, {}};
}

}  // namespace

Parsed<LabelSelector> LabelSelector::parse(std::string_view text) {
  TextCursor in("selector", text);
  LabelSelector selector;
  try {
    if (in.atEnd()) return {selector, {}};
    do {
      selector.add(parseRequirement(in));
    } while (in.consume(","));
    if (!in.atEnd()) in.fail("expected ',' or the end");
  } catch (const ParseError& e) {
    return {std::nullopt, e.what()};
  }
  return {std::move(selector), {}};
}

std::string LabelSelector::toText() const {
  std::string out;
  for (const auto& r : requirements_) {
    if (!out.empty()) out += ",";
    auto list = [&] {
      std::string s = "(";
      for (size_t i = 0; i < r.values.size(); ++i) s += (i ? ", " : "") + r.values[i];
      return s + ")";
    };
    switch (r.op) {
      case Op::EQUALS:
        out += r.key + "=" + r.values[0];
        break;
      case Op::NOT_EQUALS:
        out += r.key + "!=" + r.values[0];
        break;
      case Op::IN:
        out += r.key + " in " + list();
        break;
      case Op::NOT_IN:
        out += r.key + " notin " + list();
        break;
      case Op::EXISTS:
        out += r.key;
        break;
      case Op::NOT_EXISTS:
        out += "!" + r.key;
        break;
    }
  }
  return out;
}

std::optional<std::vector<std::string>> LabelSelector::allowedValues(std::string_view key) const {
  std::optional<std::vector<std::string>> allowed;
  for (const auto& r : requirements_) {
    if (r.key != key || (r.op != Op::EQUALS && r.op != Op::IN)) continue;
    std::vector<std::string> these = r.values;  // sorted: IN canonicalised, EQUALS has one
    if (!allowed) {
      allowed = std::move(these);
    } else {
      std::vector<std::string> both;
      std::set_intersection(allowed->begin(), allowed->end(), these.begin(), these.end(),
                            std::back_inserter(both));
      allowed = std::move(both);
    }
  }
  return allowed;
}

}  // namespace troupe::sched

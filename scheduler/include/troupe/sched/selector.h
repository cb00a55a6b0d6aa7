// File: troupe/sched/selector.h
//
// Kubernetes-like label selectors: the textual hard constraints of a Placement.
//
// Grammar (whitespace between tokens is ignored):
//
//   selector    := requirement ("," requirement)*      -- empty text selects every node
//   requirement := key "=" value | key "==" value | key "!=" value
//                | key "in" "(" values ")" | key "notin" "(" values ")"
//                | key | "!" key
//   values      := value ("," value)*
//   key, value  := one or more of  A-Z a-z 0-9 . _ - /
//
// Semantics follow Kubernetes: `k!=v` and `k notin (..)` also select nodes without the label.

#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::sched {

/// A node's labels. Always holds `group`, `instance_type` and `host`.
using Labels = std::map<std::string, std::string, std::less<>>;

/// The result of parsing text: a value, or an error message that names the text and points at
/// the column (1-based) where parsing stopped.
template <typename T>
struct Parsed {
  std::optional<T> value;
  std::string error;  // empty when `value` is set

  explicit operator bool() const { return value.has_value(); }
  const T& operator*() const { return *value; }
  const T* operator->() const { return &*value; }
};

/// A conjunction of label requirements.
class LabelSelector {
 public:
  enum class Op : uint8_t { EQUALS, NOT_EQUALS, IN, NOT_IN, EXISTS, NOT_EXISTS };

  struct Requirement {
    std::string key;
    Op op;
    /// One value for EQUALS / NOT_EQUALS; a sorted, de-duplicated set for IN / NOT_IN; empty
    /// for EXISTS / NOT_EXISTS.
    std::vector<std::string> values;

    bool matches(const Labels& labels) const;
    bool operator==(const Requirement&) const = default;
  };

  LabelSelector() = default;

  /// Parses selector text. Errors read like
  /// "selector 'group=,x': expected a value at column 7".
  static Parsed<LabelSelector> parse(std::string_view text);

  /// True when every requirement holds for `labels`.
  bool matches(const Labels& labels) const;

  /// Canonical text; `parse(s.toText()) == s`.
  std::string toText() const;

  bool empty() const { return requirements_.empty(); }
  const std::vector<Requirement>& requirements() const { return requirements_; }

  /// The set of values the selector allows for `key`, when one EQUALS or IN requirement pins it;
  /// nothing otherwise. Lets a decision look only at the groups a selector names.
  std::optional<std::vector<std::string>> allowedValues(std::string_view key) const;

  /// Adds a requirement (values are canonicalised).
  LabelSelector& add(Requirement requirement);

  bool operator==(const LabelSelector&) const = default;

 private:
  std::vector<Requirement> requirements_;
};

/// True when `c` may appear in a label key or value (and in group and resource names).
bool isNameChar(char c);

}  // namespace troupe::sched

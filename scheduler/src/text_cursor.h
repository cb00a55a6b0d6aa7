// Private: a cursor over text being parsed, shared by the selector and placement parsers so both
// report errors the same way ("<what> '<text>': <problem> at column N", columns 1-based).

#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "troupe/sched/selector.h"

namespace troupe::sched::detail {

/// Thrown inside a parser, caught at its entry point and turned into Parsed::error.
struct ParseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class TextCursor {
 public:
  /// `what` names the kind of text in errors: "selector", "placement".
  TextCursor(std::string_view what, std::string_view text) : what_(what), text_(text) {}

  void skipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool atEnd() {
    skipSpace();
    return pos_ == text_.size();
  }
  /// The next non-space character, or '\0' at the end.
  char peek() {
    skipSpace();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  /// Consumes `token` when it comes next.
  bool consume(std::string_view token) {
    skipSpace();
    if (text_.substr(pos_).starts_with(token)) {
      pos_ += token.size();
      return true;
    }
    return false;
  }
  void expect(std::string_view token) {
    if (!consume(token)) fail("expected '" + std::string(token) + "'");
  }
  /// A run of name characters; empty when none comes next.
  std::string_view name() {
    skipSpace();
    size_t start = pos_;
    while (pos_ < text_.size() && isNameChar(text_[pos_])) ++pos_;
    return text_.substr(start, pos_ - start);
  }
  /// A name that must be present; `kind` describes it in the error ("a value", "a key").
  std::string requireName(std::string_view kind) {
    std::string_view n = name();
    if (n.empty()) fail("expected " + std::string(kind));
    return std::string(n);
  }

  size_t position() const { return pos_; }
  void setPosition(size_t pos) { pos_ = pos; }
  std::string_view text() const { return text_; }

  /// Throws a ParseError pointing at the current position (after skipping spaces).
  [[noreturn]] void fail(const std::string& problem) {
    skipSpace();
    failAt(pos_, problem);
  }
  [[noreturn]] void failAt(size_t pos, const std::string& problem) const {
    // Columns are 1-based; the end of the text is column size + 1, so the caret always has a place.
    throw ParseError(std::string(what_) + " '" + std::string(text_) + "': " + problem +
                     " at column " + std::to_string(pos + 1));
  }

 private:
  std::string_view what_;
  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace troupe::sched::detail

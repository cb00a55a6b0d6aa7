// What the dataset sources share (source.cpp, webdataset.cpp): file reading and labels.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace troupe::data::files {

std::string lower(std::string s);
bool isImage(const std::filesystem::path& p);  // by extension, imageExtensions()
bool isImageExtension(const std::string& ext); // ".jpg" (any case) is one of imageExtensions()
std::string extensionList();                   // ".jpg .jpeg ..."

// The whole file; SampleError naming it when it cannot be read, is cut short or is empty.
std::vector<uint8_t> readWhole(const std::string& path);

// "0" .. "maxLabel".
std::vector<std::string> numberedClasses(int64_t maxLabel);

// A class number (digits only, 0 or more), or nullopt.
std::optional<int64_t> parseLabel(const std::string& text);

}  // namespace troupe::data::files

// Read-only memory mapping of a whole file. Mapping is lazy: nothing is read until a page is
// touched, which is what lets `inspect` validate a 510 GB checkpoint's headers without reading
// tensor data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace dsv41 {

class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops this mapping's resident pages over [ptr, ptr + len) (rounded inward to whole pages);
  // later reads fault them in again from the file. Lets a streaming reader bound its RSS.
  void release(const uint8_t* ptr, std::size_t len) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dsv41

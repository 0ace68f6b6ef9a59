// Read-only memory mapping of a whole file. Mapping is lazy: nothing is read until a page is
// touched, which is what lets `inspect` validate a 510 GB checkpoint's headers without reading
// tensor data. A file of 2 MB or more maps on a 2 MB boundary, so a range of it can be replaced in
// place by an anonymous copy on transparent huge pages (make_resident_huge): the weights' readers
// keep their pointers, and the kernels stop missing the TLB every 4 KB.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/huge_alloc.h"
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
  // Replaces the 2 MB-aligned interior of [ptr, ptr + len) with anonymous memory advised for
  // transparent huge pages (MADV_HUGEPAGE) holding the same bytes, read from the file again, then
  // read-only. The edges stay file-mapped. Returns the bytes moved (0 when the range holds no
  // whole 2 MB page). Not safe while another thread reads the range (it is zero until the read
  // completes): call it at load, before the weights are used. On failure the range maps the file
  // again. release() aborts once anything moved (it would drop the copy).
  Result<std::size_t> make_resident_huge(const uint8_t* ptr, std::size_t len) const;
  static constexpr std::size_t kHugePage = kHugePageBytes;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t map_len_ = 0;     // size_ rounded up to whole pages (what munmap releases)
  uint64_t dev_ = 0, ino_ = 0;  // the file's identity, checked when it is read again
  mutable std::atomic<bool> moved_{false};  // make_resident_huge moved some page
};

// Whether the kernel gives MADV_HUGEPAGE regions huge pages (transparent_hugepage/enabled is
// `always` or `madvise`); the reason when not.
Status transparent_huge_pages_available();

}  // namespace dsv41

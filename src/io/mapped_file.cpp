// MappedFile: open + fstat + mmap(PROT_READ, MAP_PRIVATE) on a 2 MB boundary; empty files map to
// a null view. And the in-place copies of its ranges onto transparent huge pages.
#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace dsv41 {

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(path + ": not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = std::size_t(st.st_size);
  f->dev_ = uint64_t(st.st_dev);
  f->ino_ = uint64_t(st.st_ino);
  if (f->size_ > 0) {
    const auto page = std::size_t(::sysconf(_SC_PAGESIZE));
    f->map_len_ = (f->size_ + page - 1) / page * page;
    // Files of a huge page or more go on a 2 MB boundary: reserve the length plus 2 MB, map the
    // file at the first boundary inside, give back the slack on both sides.
    void* want = nullptr;
    uint8_t* slack = nullptr;
    const std::size_t reserve = f->map_len_ + kHugePage;
    if (f->size_ >= kHugePage) {
      void* r =
          ::mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (r != MAP_FAILED) {
        slack = static_cast<uint8_t*>(r);
        want = reinterpret_cast<void*>((uintptr_t(r) + kHugePage - 1) & ~(kHugePage - 1));
      }
    }
    void* p = ::mmap(want, f->size_, PROT_READ, MAP_PRIVATE | (want ? MAP_FIXED : 0), fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      if (slack) ::munmap(slack, reserve);
      ::close(fd);
      return Status::error(path + ": cannot mmap: " + std::strerror(err));
    }
    if (slack) {
      uint8_t* a = static_cast<uint8_t*>(p);
      if (a > slack) ::munmap(slack, std::size_t(a - slack));
      if (slack + reserve > a + f->map_len_)
        ::munmap(a + f->map_len_, std::size_t(slack + reserve - (a + f->map_len_)));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

void MappedFile::release(const uint8_t* ptr, std::size_t len) const {
  DSV41_CHECK_MSG(!moved_.load(), "release() after make_resident_huge() would drop the copy");
  const auto page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = (uintptr_t(ptr) + page - 1) & ~(page - 1),
                  e = (uintptr_t(ptr) + len) & ~(page - 1);
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

Result<std::size_t> MappedFile::make_resident_huge(const uint8_t* ptr, std::size_t len) const {
  DSV41_CHECK(ptr >= data_ && ptr + len <= data_ + size_);
  const uintptr_t b = (uintptr_t(ptr) + kHugePage - 1) & ~(kHugePage - 1),
                  e = (uintptr_t(ptr) + len) & ~(kHugePage - 1);
  if (e <= b) return std::size_t(0);
  const std::size_t n = e - b;
  const auto off = off_t(b - uintptr_t(data_));
  // Open the file again before touching the mapping; once it is touched, any failure maps the
  // file back over the range (a failed MAP_FIXED may already have removed the old mapping on
  // older kernels), so the range reads the file's bytes again; if even that fails the mapping is
  // unusable and the process stops.
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(path_ + ": cannot open again: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || uint64_t(st.st_dev) != dev_ || uint64_t(st.st_ino) != ino_ ||
      std::size_t(st.st_size) != size_) {
    ::close(fd);
    return Status::error(path_ + ": the file changed since it was mapped");
  }
  void* a = ::mmap(reinterpret_cast<void*>(b), n, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  auto map_back = [&] {
    void* back = ::mmap(reinterpret_cast<void*>(b), n, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, off);
    DSV41_CHECK_MSG(back != MAP_FAILED, path_.c_str());
  };
  if (a == MAP_FAILED) {
    const int err = errno;
    map_back();
    ::close(fd);
    return Status::error(path_ + ": cannot map memory for a huge-page copy: " + std::strerror(err));
  }
  ::madvise(a, n, MADV_HUGEPAGE);  // advice only: without it the copy is still correct
  std::size_t got = 0;
  std::string failure;
  while (got < n) {
    const ssize_t r = ::pread(fd, static_cast<uint8_t*>(a) + got, n - got, off + off_t(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      failure = r == 0 ? std::string("unexpected end of file") : std::string(std::strerror(errno));
      break;
    }
    got += std::size_t(r);
  }
  if (!failure.empty()) map_back();  // the range held part of a copy
  ::close(fd);
  if (!failure.empty()) {
    return Status::error(path_ + ": reading bytes " + std::to_string(off) + ".." +
                         std::to_string(off + off_t(n)) + " again: " + failure);
  }
  ::mprotect(a, n, PROT_READ);
  moved_.store(true);
  return n;
}

Status transparent_huge_pages_available() {
  const char* knob = "/sys/kernel/mm/transparent_hugepage/enabled";
  std::ifstream f(knob);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string v = ss.str();
  if (!f || v.empty()) return Status::error(std::string(knob) + " cannot be read");
  if (v.find("[always]") != std::string::npos || v.find("[madvise]") != std::string::npos)
    return Status::ok();
  return Status::error(std::string(knob) + " is `" + v.substr(0, v.find('\n')) + "`");
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), map_len_);
}

}  // namespace dsv41

// Image parts' http(s) and file:// URLs (issue 33 item 4, server/image_sources.h), in process: the
// fetch against a web server on 127.0.0.1 (image_origin.h) with its limits (size, a total time,
// redirects, status, bodies that are no image), the local files under a directory (symbolic links
// and .. resolved, regular files only) and read_image_part's refusals when a flag is off.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "io/test_util.h"
#include "server/image_inputs.h"
#include "server/image_origin.h"
#include "server/image_sources.h"

namespace dsv41::server_testing {
namespace {

using Clock = std::chrono::steady_clock;

double elapsed_s(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

ImageSourceOptions url_options() {
  ImageSourceOptions o;
  o.allow_urls = true;
  o.timeout = std::chrono::milliseconds(1000);
  return o;
}

std::string error_of(const Result<std::string>& r) {
  return r.is_ok() ? std::string("(no error)") : r.status().message();
}

TEST(ImageUrls, APngIsFetchedAndRedirectsAreFollowed) {
  ImageOrigin origin;
  FetchReport rep;
  auto png = fetch_image_url(origin.url("/img.png"), url_options(), &rep);
  ASSERT_TRUE(png.is_ok()) << error_of(png);
  EXPECT_EQ(*png, origin.png());
  EXPECT_EQ(rep.requests, 1);
  // A relative Location, and an absolute one to that: three requests.
  FetchReport hops;
  auto redirected = fetch_image_url(origin.url("/redirect-absolute"), url_options(), &hops);
  ASSERT_TRUE(redirected.is_ok()) << error_of(redirected);
  EXPECT_EQ(*redirected, origin.png());
  EXPECT_EQ(hops.requests, 3);
  // The scheme is case-insensitive, the fragment not sent.
  std::string upper = origin.url("/img.png#frag");
  upper.replace(0, 4, "HTTP");
  EXPECT_TRUE(fetch_image_url(upper, url_options()).is_ok());
}

TEST(ImageUrls, RedirectsAreBoundedAndEachHopIsChecked) {
  ImageOrigin origin;
  FetchReport rep;
  auto loop = fetch_image_url(origin.url("/loop/0"), url_options(), &rep);
  ASSERT_FALSE(loop.is_ok());
  EXPECT_NE(error_of(loop).find("redirects more than 5 times"), std::string::npos)
      << error_of(loop);
  EXPECT_EQ(rep.requests, 6);  // the first request and 5 redirects followed
  auto to_file = fetch_image_url(origin.url("/to-file"), url_options());
  ASSERT_FALSE(to_file.is_ok());
  EXPECT_NE(error_of(to_file).find("redirected to file:///etc/passwd: only http:// and https://"),
            std::string::npos)
      << error_of(to_file);
}

TEST(ImageUrls, StatusAndBodiesThatAreNoImageAreRefused) {
  ImageOrigin origin;
  auto missing = fetch_image_url(origin.url("/missing"), url_options());
  EXPECT_NE(error_of(missing).find("answered HTTP 404"), std::string::npos) << error_of(missing);
  FetchReport rep;
  auto page = fetch_image_url(origin.url("/page"), url_options(), &rep);
  EXPECT_NE(error_of(page).find("is no PNG, JPEG, WebP or GIF image (Content-Type: text/html)"),
            std::string::npos)
      << error_of(page);
  // A closed port: refused at once, not after the time limit.
  const auto t0 = Clock::now();
  auto closed = fetch_image_url("http://127.0.0.1:1/a.png", url_options());
  EXPECT_NE(error_of(closed).find("could not connect"), std::string::npos) << error_of(closed);
  EXPECT_LT(elapsed_s(t0), 0.9);
  for (const char* bad : {"http://user:pw@127.0.0.1/a.png", "http:///a.png", "http://h:99999/a",
                          "http://h/a b.png", "ftp://h/a.png", "http://[::1/a.png"}) {
    auto r = fetch_image_url(bad, url_options());
    EXPECT_FALSE(r.is_ok()) << bad;
  }
}

// The body is refused as soon as it passes the limit: the client read at most one buffer past it
// and left, and the server saw its writes fail long before its 1 GB.
TEST(ImageUrls, ABodyOverTheLimitIsCutOffThere) {
  ImageOrigin origin;
  ImageSourceOptions o = url_options();
  o.max_bytes = std::size_t(1) << 20;
  o.timeout = std::chrono::milliseconds(20000);
  FetchReport rep;
  const auto t0 = Clock::now();
  auto huge = fetch_image_url(origin.url("/huge"), o, &rep);
  ASSERT_FALSE(huge.is_ok());
  EXPECT_NE(error_of(huge).find("larger than 1 MB"), std::string::npos) << error_of(huge);
  EXPECT_LE(rep.bytes_received, o.max_bytes + (std::size_t(64) << 10));
  EXPECT_LT(elapsed_s(t0), 5.0);
  EXPECT_TRUE(origin.wait_huge_client_left());
  EXPECT_LT(origin.huge_sent(), std::size_t(64) << 20) << "of " << ImageOrigin::kHugeBytes;
  // A Content-Length over the limit: refused from the headers, no body byte read.
  origin.reset_huge();
  FetchReport declared;
  auto big = fetch_image_url(origin.url("/huge-declared"), o, &declared);
  EXPECT_NE(error_of(big).find("Content-Length (1073741824 bytes) is over the 1 MB limit"),
            std::string::npos)
      << error_of(big);
  EXPECT_EQ(declared.bytes_received, 0u);
  EXPECT_TRUE(origin.wait_huge_client_left());
  EXPECT_LT(origin.huge_sent(), std::size_t(64) << 20);
}

// The time limit covers the whole fetch: an answer that never comes, a body that trickles (every
// read quick), header lines that trickle (no body callback to check the clock in).
TEST(ImageUrls, TheTimeLimitCoversTheWholeFetch) {
  ImageOrigin origin;
  for (const std::string& url :
       {origin.url("/slow"), origin.url("/trickle"), origin.trickling_headers_url()}) {
    const auto t0 = Clock::now();
    auto r = fetch_image_url(url, url_options());
    const double took = elapsed_s(t0);
    EXPECT_NE(error_of(r).find("took longer than the server's limit of 1 s (--image-url-timeout)"),
              std::string::npos)
        << url << ": " << error_of(r);
    EXPECT_GE(took, 0.9) << url;
    EXPECT_LT(took, 2.0) << url;
  }
}

TEST(ImageUrls, EachSchemeNeedsItsFlag) {
  ImageSourceOptions off;
  auto http = read_image_part("https://example.com/a.png", off);
  EXPECT_NE(error_of(http).find("--allow-image-urls"), std::string::npos) << error_of(http);
  auto file = read_image_part("file:///etc/hostname", off);
  EXPECT_NE(error_of(file).find("--allowed-local-media-path"), std::string::npos) << error_of(file);
  for (const char* other : {"/etc/hostname", "ftp://example.com/a.png", "gopher:x"}) {
    auto r = read_image_part(other, off);
    EXPECT_NE(error_of(r).find("only data: URLs"), std::string::npos) << other << error_of(r);
  }
  auto data = read_image_part("data:image/png;base64,aGk=", off);
  ASSERT_TRUE(data.is_ok()) << error_of(data);
  EXPECT_EQ(*data, "hi");
}

class LocalMedia : public ::testing::Test {
 protected:
  void SetUp() override {
    namespace fs = std::filesystem;
    root_ = fs::canonical(tmp_.path()).string();
    fs::create_directories(root_ + "/media/sub");
    fs::create_directories(root_ + "/elsewhere");
    png_ = dsv41::testing::read_file(kOriginPng);
    dsv41::testing::write_file(root_ + "/media/img.png", png_);
    dsv41::testing::write_file(root_ + "/media/a b.png", png_);
    dsv41::testing::write_file(root_ + "/elsewhere/secret.png", png_);
    fs::create_symlink(root_ + "/elsewhere/secret.png", root_ + "/media/link-out.png");
    fs::create_symlink(root_ + "/media/img.png", root_ + "/media/sub/link-in.png");
    fs::create_directory_symlink(root_ + "/elsewhere", root_ + "/media/dir-out");
    ASSERT_EQ(::mkfifo((root_ + "/media/fifo.png").c_str(), 0600), 0);
    auto dir = canonical_media_dir(root_ + "/media/sub/..");
    ASSERT_TRUE(dir.is_ok()) << dir.status().message();
    o_.local_media_dir = *dir;
  }
  std::string url(const std::string& path) const { return "file://" + root_ + path; }
  dsv41::testing::TempDir tmp_;
  std::string root_, png_;
  ImageSourceOptions o_;
};

TEST_F(LocalMedia, FilesInsideTheDirectoryAreRead) {
  EXPECT_EQ(o_.local_media_dir, root_ + "/media");
  for (const std::string& u :
       {url("/media/img.png"), url("/media/sub/../img.png"), url("/media/sub/link-in.png"),
        url("/media/a%20b.png"), "file://localhost" + root_ + "/media/img.png"}) {
    auto r = read_local_image(u, o_);
    ASSERT_TRUE(r.is_ok()) << u << ": " << error_of(r);
    EXPECT_EQ(*r, png_) << u;
  }
  auto via_part = read_image_part(url("/media/img.png"), o_);
  ASSERT_TRUE(via_part.is_ok()) << error_of(via_part);
}

TEST_F(LocalMedia, EverythingElseIsRefused) {
  const std::string outside = "outside the server's --allowed-local-media-path";
  for (const std::string& u :
       {url("/elsewhere/secret.png"), url("/media/../elsewhere/secret.png"),
        url("/media/link-out.png"), url("/media/dir-out/secret.png"), url("/media/missing/../../x"),
        url("/elsewhere/none.png"), std::string("file:///etc/passwd")}) {
    auto r = read_local_image(u, o_);
    EXPECT_NE(error_of(r).find(outside), std::string::npos) << u << ": " << error_of(r);
  }
  auto dir = read_local_image(url("/media/sub"), o_);
  EXPECT_NE(error_of(dir).find("a directory, not a regular file"), std::string::npos)
      << error_of(dir);
  auto media = read_local_image(url("/media"), o_);  // the directory itself is not inside it
  EXPECT_FALSE(media.is_ok());
  auto fifo = read_local_image(url("/media/fifo.png"), o_);  // would block a plain open()
  EXPECT_NE(error_of(fifo).find("a FIFO, not a regular file"), std::string::npos) << error_of(fifo);
  auto missing = read_local_image(url("/media/none.png"), o_);
  EXPECT_NE(error_of(missing).find("no such file"), std::string::npos) << error_of(missing);
  auto relative = read_local_image("file:media/img.png", o_);
  EXPECT_NE(error_of(relative).find("absolute path"), std::string::npos) << error_of(relative);
  auto host = read_local_image("file://server" + root_ + "/media/img.png", o_);
  EXPECT_NE(error_of(host).find("absolute path"), std::string::npos) << error_of(host);
  auto nul = read_local_image(url("/media/img.png%00.txt"), o_);
  EXPECT_NE(error_of(nul).find("%-escape"), std::string::npos) << error_of(nul);
  ImageSourceOptions small = o_;
  small.max_bytes = png_.size() - 1;
  auto big = read_local_image(url("/media/img.png"), small);
  EXPECT_NE(error_of(big).find("larger than"), std::string::npos) << error_of(big);
  EXPECT_FALSE(canonical_media_dir(root_ + "/media/img.png").is_ok());
  EXPECT_FALSE(canonical_media_dir(root_ + "/none").is_ok());
}

}  // namespace
}  // namespace dsv41::server_testing

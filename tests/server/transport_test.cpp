// The event-driven transport (server/http_transport.h) on its own, over raw sockets: deadlines
// that free slow and idle connections, the connection caps, a slow reader cut without blocking
// its worker, hang-ups seen by a handler, HTTP/1.0, HEAD and pipelining. And the server on it
// (issue 37): slowloris and idle connections by the hundred do not starve /health or completions.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "server/http_transport.h"
#include "server/server_harness.h"

namespace dsv41::server_testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int connect_to(int port, int rcvbuf = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& d) {
  return ::send(fd, d.data(), d.size(), MSG_NOSIGNAL) == ssize_t(d.size());
}

// Reads until `until` appears, the peer closes, or `timeout` passes. closed: the peer ended the
// connection (EOF or reset).
struct Read {
  std::string data;
  bool closed = false;
};
Read read_until(int fd, const std::string& until, std::chrono::milliseconds timeout) {
  Read r;
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (!until.empty() && r.data.find(until) != std::string::npos) return r;
    pollfd p{fd, POLLIN, 0};
    const int left =
        int(std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
    if (::poll(&p, 1, std::max(left, 1)) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      r.closed = true;
      return r;
    }
    r.data.append(buf, std::size_t(n));
  }
  return r;
}

// A bare transport whose handler is the test's.
struct Bare {
  http::Transport t;
  std::thread thread;
  explicit Bare(http::TransportOptions o,
                std::function<void(http::Request&, http::Response&, const http::Connection&)> h)
      : t(with_port0(std::move(o)), hooks(std::move(h))) {
    EXPECT_TRUE(t.bind().is_ok());
    thread = std::thread([this] { t.run(); });
  }
  ~Bare() {
    t.stop();
    thread.join();
  }
  int port() const { return t.port(); }
  static http::TransportOptions with_port0(http::TransportOptions o) {
    o.port = 0;
    return o;
  }
  static http::TransportHooks hooks(
      std::function<void(http::Request&, http::Response&, const http::Connection&)> h) {
    http::TransportHooks k;
    k.screen = [](const http::Request&) { return std::optional<http::Response>(); };
    k.handle = std::move(h);
    k.error = [](int status, const std::string& message, const std::string&) {
      http::Response r;
      r.status = status;
      r.set_content(message, "text/plain");
      return r;
    };
    return k;
  }
};

void ok_handler(http::Request& req, http::Response& res, const http::Connection&) {
  res.set_content("ok " + req.path, "text/plain");
}

const std::string kGet = "GET /x HTTP/1.1\r\nHost: t\r\n\r\n";

TEST(Transport, HeaderDeadlineClosesASlowlorisThatKeepsSending) {
  http::TransportOptions o;
  o.header_timeout = 300ms;
  Bare b(o, ok_handler);
  const int fd = connect_to(b.port());
  ASSERT_GE(fd, 0);
  const auto t0 = Clock::now();
  bool cut = !send_all(fd, "GET /x HTTP/1.1\r\nHost: t\r\n");
  // A header line every 50 ms: never idle, never done.
  for (int i = 0; !cut && i < 60; ++i) {
    std::this_thread::sleep_for(50ms);
    Read r = read_until(fd, "", 1ms);
    cut = r.closed || !send_all(fd, fmt::format("X-Slow-{}: {}\r\n", i, i));
  }
  const double after = seconds_since(t0);
  EXPECT_TRUE(cut) << "still open after " << after << " s";
  EXPECT_LT(after, 1.5);
  EXPECT_GE(after, 0.25);
  close(fd);
  EXPECT_GE(b.t.counters().timed_out, 1);
  // A connection that sends nothing at all goes the same way.
  const int quiet = connect_to(b.port());
  Read r = read_until(quiet, "", 2000ms);
  EXPECT_TRUE(r.closed);
  close(quiet);
}

TEST(Transport, IdleKeepAliveConnectionsAreClosedAndRequestsPipeline) {
  http::TransportOptions o;
  o.keep_alive_timeout = 300ms;
  Bare b(o, ok_handler);
  const int fd = connect_to(b.port());
  // Two requests in one write: two answers, in order, on the kept connection.
  ASSERT_TRUE(send_all(fd, kGet + "GET /y HTTP/1.1\r\nHost: t\r\n\r\n"));
  Read r = read_until(fd, "ok /y", 2000ms);
  EXPECT_NE(r.data.find("ok /x"), std::string::npos) << r.data;
  EXPECT_LT(r.data.find("ok /x"), r.data.find("ok /y")) << r.data;
  EXPECT_FALSE(r.closed);
  const auto t0 = Clock::now();
  Read idle = read_until(fd, "", 3000ms);
  EXPECT_TRUE(idle.closed);
  EXPECT_LT(seconds_since(t0), 1.5);
  close(fd);

  // HTTP/1.0: the answer says close and the connection ends; HEAD: the length, no body.
  const int old = connect_to(b.port());
  ASSERT_TRUE(send_all(old, "GET /z HTTP/1.0\r\n\r\n"));
  Read r10 = read_until(old, "", 2000ms);
  EXPECT_TRUE(r10.closed);
  EXPECT_NE(r10.data.find("Connection: close"), std::string::npos) << r10.data;
  EXPECT_NE(r10.data.find("ok /z"), std::string::npos) << r10.data;
  close(old);
  const int head = connect_to(b.port());
  ASSERT_TRUE(send_all(head, "HEAD /w HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"));
  Read rh = read_until(head, "", 2000ms);
  EXPECT_NE(rh.data.find("Content-Length: 5"), std::string::npos) << rh.data;
  EXPECT_EQ(rh.data.find("ok /w"), std::string::npos) << rh.data;
  close(head);
}

TEST(Transport, ConnectionCapsAnswer503AndFreeSlotsAreReused) {
  http::TransportOptions o;
  o.max_connections = 4;
  Bare b(o, ok_handler);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(connect_to(b.port()));
  std::this_thread::sleep_for(200ms);  // (accepted by the server's loop)
  const int over = connect_to(b.port());
  Read r = read_until(over, "", 2000ms);
  EXPECT_EQ(r.data.rfind("HTTP/1.1 503", 0), 0u) << r.data;
  EXPECT_NE(r.data.find("--max-connections"), std::string::npos) << r.data;
  EXPECT_TRUE(r.closed);
  EXPECT_EQ(b.t.counters().refused, 1);
  EXPECT_EQ(b.t.counters().open, 4);
  close(over);
  close(held.back());
  held.pop_back();
  std::this_thread::sleep_for(200ms);
  const int again = connect_to(b.port());
  ASSERT_TRUE(send_all(again, kGet));
  Read ok = read_until(again, "ok /x", 2000ms);
  EXPECT_EQ(ok.data.rfind("HTTP/1.1 200", 0), 0u) << ok.data;
  close(again);
  for (int fd : held) close(fd);

  http::TransportOptions per;
  per.max_connections_per_client = 2;
  Bare c(per, ok_handler);
  const int a1 = connect_to(c.port()), a2 = connect_to(c.port());
  std::this_thread::sleep_for(200ms);
  const int a3 = connect_to(c.port());
  Read r3 = read_until(a3, "", 2000ms);
  EXPECT_EQ(r3.data.rfind("HTTP/1.1 503", 0), 0u) << r3.data;
  EXPECT_NE(r3.data.find("--max-connections-per-client"), std::string::npos) << r3.data;
  for (int fd : {a1, a2, a3}) close(fd);
}

TEST(Transport, HeaderLinesAreCapped) {
  Bare b({}, ok_handler);
  std::string many = "GET /x HTTP/1.1\r\nHost: t\r\n";
  for (int i = 0; i < 201; ++i) many += fmt::format("X-{}: v\r\n", i);
  const int fd = connect_to(b.port());
  ASSERT_TRUE(send_all(fd, many + "\r\n"));
  Read r = read_until(fd, "", 2000ms);
  EXPECT_EQ(r.data.rfind("HTTP/1.1 431", 0), 0u) << r.data;
  EXPECT_NE(r.data.find("202 lines (at most 200 lines"), std::string::npos) << r.data;
  close(fd);
}

// A client that never reads a stream: its bytes wait in the bounded buffer, then the stream is
// cut. The worker's writes never block meanwhile.
TEST(Transport, ASlowReaderIsCutAndItsWorkerNeverBlocks) {
  http::TransportOptions o;
  o.stream_buffer_bytes = 64 << 10;
  std::atomic<int64_t> written{0};
  std::atomic<double> slowest_write{0};
  std::atomic<int> ended{-1};
  Bare b(o, [&](http::Request&, http::Response& res, const http::Connection&) {
    res.set_header("Content-Type", "text/event-stream");
    res.stream = [&](http::StreamSink& sink) {
      const std::string piece(1024, 'x');
      for (int i = 0; i < 64 * 1024; ++i) {  // up to 64 MB
        const auto t0 = Clock::now();
        const bool ok = sink.write(piece);
        slowest_write = std::max(slowest_write.load(), seconds_since(t0));
        if (!ok) return false;
        written += int64_t(piece.size());
        if (i % 64 == 0) std::this_thread::sleep_for(1ms);  // (the socket buffers fill meanwhile)
      }
      sink.done();
      return true;
    };
    res.stream_end = [&](bool complete) { ended = complete ? 1 : 0; };
  });
  const int fd = connect_to(b.port(), 4096);
  ASSERT_TRUE(send_all(fd, kGet));
  for (int i = 0; i < 200 && ended.load() < 0; ++i) std::this_thread::sleep_for(25ms);
  EXPECT_EQ(ended.load(), 0) << "the stream was not cut (" << written.load() << " bytes written)";
  EXPECT_EQ(b.t.counters().streams_cut, 1);
  EXPECT_LT(written.load(), 32 << 20);
  EXPECT_LT(slowest_write.load(), 0.05);
  // The connection was closed: what the client reads ends.
  int64_t got = 0;
  for (;;) {
    Read r = read_until(fd, "", 2000ms);
    got += int64_t(r.data.size());
    if (r.closed || r.data.empty()) {
      EXPECT_TRUE(r.closed);
      break;
    }
  }
  EXPECT_LT(got, written.load() + 1024);
  close(fd);
}

TEST(Transport, AHandlerSeesAHangUpAndExceptionsAre500) {
  std::atomic<double> seen_after{-1};
  Bare b({}, [&](http::Request& req, http::Response& res, const http::Connection& conn) {
    if (req.path == "/throw") throw std::runtime_error("boom");
    const auto t0 = Clock::now();
    while (!conn.gone() && seconds_since(t0) < 5) std::this_thread::sleep_for(10ms);
    seen_after = seconds_since(t0);
    res.set_content("late", "text/plain");
  });
  const int fd = connect_to(b.port());
  ASSERT_TRUE(send_all(fd, kGet));
  std::this_thread::sleep_for(200ms);
  close(fd);
  for (int i = 0; i < 100 && seen_after.load() < 0; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_GE(seen_after.load(), 0.15);
  EXPECT_LT(seen_after.load(), 1.0);
  const int t = connect_to(b.port());
  ASSERT_TRUE(send_all(t, "GET /throw HTTP/1.1\r\nHost: t\r\n\r\n"));
  Read r = read_until(t, "boom", 2000ms);
  EXPECT_EQ(r.data.rfind("HTTP/1.1 500", 0), 0u) << r.data;
  close(t);
}

TEST(Transport, AFrameLargerThanTheStreamBufferReachesAReader) {
  http::TransportOptions o;
  o.stream_buffer_bytes = 4096;  // the limit is on a reader's lag, not on a frame's size
  std::atomic<int> ended{-1};
  Bare b(o, [&](http::Request&, http::Response& res, const http::Connection&) {
    res.stream = [](http::StreamSink& sink) {
      for (char c : {'a', 'b', 'c'}) {
        if (!sink.write(std::string(64 << 10, c))) return false;
        std::this_thread::sleep_for(20ms);  // (the reader takes each before the next)
      }
      sink.done();
      return true;
    };
    res.stream_end = [&](bool complete) { ended = complete ? 1 : 0; };
  });
  const int fd = connect_to(b.port());
  ASSERT_TRUE(send_all(fd, kGet));
  Read r = read_until(fd, "0\r\n\r\n", 5000ms);
  EXPECT_NE(r.data.find(std::string(1024, 'c')), std::string::npos);
  for (int i = 0; i < 100 && ended.load() < 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(ended.load(), 1);
  close(fd);
}

TEST(Transport, StopLetsAnAnswerUnderWayGoOut) {
  std::atomic<bool> handled{false};
  const std::size_t size = 8 << 20;  // more than the socket buffers hold
  Bare b({}, [&](http::Request&, http::Response& res, const http::Connection&) {
    res.set_content(std::string(size, 'z'), "text/plain");
    handled = true;
  });
  const int fd = connect_to(b.port(), 4096);
  ASSERT_TRUE(send_all(fd, kGet));
  for (int i = 0; i < 200 && !handled.load(); ++i) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(50ms);
  b.t.stop();  // while most of the answer waits for the client
  std::size_t got = 0;
  for (;;) {
    Read r = read_until(fd, "", 3000ms);
    got += r.data.size();
    if (r.closed || r.data.empty()) break;
  }
  EXPECT_GE(got, size);
  close(fd);
  // Stopped: no new connection is served.
  const int late = connect_to(b.port());
  if (late >= 0) {
    send_all(late, kGet);
    EXPECT_EQ(read_until(late, "ok", 500ms).data.find("200"), std::string::npos);
    close(late);
  }
}

TEST(Transport, RequestBodiesHeldAtOnceAreBounded) {
  http::TransportOptions o;
  o.max_body_buffer_bytes = 1 << 20;
  Bare b(o, [](http::Request& req, http::Response& res, const http::Connection&) {
    res.set_content(std::to_string(req.body.size()), "text/plain");
  });
  auto head = [](std::size_t n) {
    return fmt::format("POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n", n);
  };
  const int a = connect_to(b.port());
  ASSERT_TRUE(send_all(a, head(800 << 10) + std::string(1000, 'a')));  // held, half sent
  std::this_thread::sleep_for(100ms);
  const int c = connect_to(b.port());
  ASSERT_TRUE(send_all(c, head(400 << 10)));
  Read rc = read_until(c, "", 2000ms);
  EXPECT_EQ(rc.data.rfind("HTTP/1.1 503", 0), 0u) << rc.data;
  EXPECT_NE(rc.data.find("Retry-After"), std::string::npos) << rc.data;
  close(c);
  ASSERT_TRUE(send_all(a, std::string((800 << 10) - 1000, 'a')));
  Read ra = read_until(a, "819200", 3000ms);
  EXPECT_EQ(ra.data.rfind("HTTP/1.1 200", 0), 0u) << ra.data.substr(0, 200);
  close(a);
  // Released: the same body is accepted now.
  const int d = connect_to(b.port());
  ASSERT_TRUE(send_all(d, head(400 << 10) + std::string(400 << 10, 'd')));
  EXPECT_EQ(read_until(d, "409600", 3000ms).data.rfind("HTTP/1.1 200", 0), 0u);
  close(d);
}

// A path of tens of KB would recurse through the routes' regular expressions until the stack ran
// out: the request line is capped (414), and the server lives on.
TEST(Connections, ALongPathIs414AndTheServerLivesOn) {
  InProcess s;
  const int fd = connect_to(s.port);
  ASSERT_TRUE(
      send_all(fd, "GET /v1/models/" + std::string(60000, 'A') + " HTTP/1.1\r\nHost: x\r\n\r\n"));
  Read r = read_until(fd, "", 3000ms);
  EXPECT_EQ(r.data.rfind("HTTP/1.1 414", 0), 0u) << r.data.substr(0, 200);
  close(fd);
  auto ok = s.client().Get("/v1/models/" + std::string(4000, 'A'));  // under the cap: a 404
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 404);
  // A kept connection's answer says how long it stays open idle (clients that pool connections
  // retire them before the server closes them).
  const int kept = connect_to(s.port);
  ASSERT_TRUE(send_all(kept, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  Read h = read_until(kept, "{\"status\":\"ok\"}", 3000ms);
  EXPECT_EQ(h.data.rfind("HTTP/1.1 200", 0), 0u) << h.data;
  EXPECT_NE(h.data.find("Keep-Alive: timeout=5\r\n"), std::string::npos) << h.data;
  close(kept);
  // The network layer's figures in /metrics.
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* name : {"dsv41_open_connections ", "dsv41_connections_refused_total 0",
                           "dsv41_connections_timed_out_total ", "dsv41_streams_cut_total 0"})
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
}

// Issue 37's starvation case on the API server: 400 slowloris connections and 1,000 idle
// keep-alive connections held by one client; /health answers within 0.5 s every time and a
// completion succeeds. (A thread per connection, as before, ran out of threads here.)
TEST(Connections, SlowlorisAndIdleConnectionsDoNotStarveTheServer) {
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);
  if (nofile.rlim_cur < 4000) GTEST_SKIP() << "open-file limit " << nofile.rlim_cur << " < 4000";
  InProcess s;
  std::vector<int> slow, idle;
  for (int i = 0; i < 400; ++i) {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0) << i;
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
    slow.push_back(fd);
  }
  for (int i = 0; i < 1000; ++i) {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0) << i;
    ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    idle.push_back(fd);
  }
  int answered = 0;
  for (int fd : idle)
    answered +=
        read_until(fd, "{\"status\":\"ok\"}", 5000ms).data.find("200 OK") != std::string::npos;
  EXPECT_EQ(answered, 1000);
  double worst = 0;
  for (int round = 0; round < 10; ++round) {
    for (std::size_t i = 0; i < slow.size(); i += 4)  // the slowloris trickle goes on
      send_all(slow[i], fmt::format("X-Trickle-{}: {}\r\n", round, i));
    const auto t0 = Clock::now();
    auto h = s.client().Get("/health");
    worst = std::max(worst, seconds_since(t0));
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
  }
  EXPECT_LT(worst, 0.5);
  auto c =
      s.client().Post("/v1/completions", R"({"model":"scripted","prompt":"hi","max_tokens":4})",
                      "application/json");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 200) << c->body;
  for (int fd : slow) close(fd);
  for (int fd : idle) close(fd);
}

}  // namespace
}  // namespace dsv41::server_testing

// libFuzzer target: raw bytes on a connection to the HTTP layer (request line, headers, body) of an
// in-process server over a scripted model; whatever arrives, the server answers with a status
// below 500 or closes the connection, and stays up. It never loads a model.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <thread>

#include "engine/scripted_runner.h"
#include "fuzz_util.h"
#include "server/http_server.h"

namespace dsv41 {

namespace {

// Answers with a fixed short chain of tokens (then EOS), a few per request.
class Chain final : public testing::ScriptedRunner {
 public:
  explicit Chain(int32_t vocab) : vocab_(vocab) {}
  int32_t vocab_size() const override { return vocab_; }
  int64_t max_context() const override { return 512; }
  Status forward(SeqId, int64_t, const std::vector<int32_t>& tokens,
                 std::vector<float>& logits) override {
    logits.assign(std::size_t(vocab_), 0.f);
    logits[std::size_t((tokens.back() * 7 + 3) % vocab_)] = 30.f;
    return Status::ok();
  }

 private:
  int32_t vocab_;
};

struct Server {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;
  Server() {
    auto tok = Tokenizer::from_json(make_tiny_tokenizer().tokenizer_json, "tiny");
    if (!tok) std::abort();
    const int32_t vocab = (*tok)->vocab_size();
    EngineOptions eo;
    eo.max_queue = 64;
    auto e = Engine::create(std::make_unique<Chain>(vocab), std::move(*tok), eo);
    if (!e) std::abort();
    engine = std::move(*e);
    ServerOptions so;
    so.port = 0;
    so.model_name = "m";
    so.max_body_bytes = 1 << 16;
    so.default_max_tokens = 4;
    http = std::make_unique<HttpServer>(*engine, so);
    if (!http->bind()) std::abort();
    port = http->port();
    thread = std::thread([this] { http->serve(); });
  }
};

// The status of the first response on a fresh connection after sending `bytes` (0: the server
// closed without one, or sent something that is not a status line).
int exchange(int port, const uint8_t* data, std::size_t size) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = -1;
  // A thousand connections a second leave the client's ports in TIME_WAIT (a 10-minute run
  // exhausted them): close with a reset (linger 0) and retry a refused connect a few times.
  for (int attempt = 0; attempt < 50; ++attempt) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    linger lg{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    close(fd);
    fd = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (fd < 0) dsv41::fuzz::invariant_failed("the server stopped accepting connections");
  // The request ends at our shutdown, so the server has all it will get: it must answer or close
  // at once. A generation here is at most the scripted model's 512-token context (milliseconds);
  // 5 s without either is a hang.
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)!send(fd, data, size, MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);  // the request ends here: the server must not wait for more
  char buf[64] = {};
  const ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
  const int recv_errno = errno;
  close(fd);
  if (got < 0 && (recv_errno == EAGAIN || recv_errno == EWOULDBLOCK))
    dsv41::fuzz::invariant_failed("the server neither answered nor closed within 5 s");
  if (got < 12 || std::string_view(buf, 9) != "HTTP/1.1 ") return 0;
  return std::atoi(buf + 9);
}

}  // namespace
}  // namespace dsv41

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  // Never destroyed: libFuzzer exits from inside a run, with the serving thread still up.
  static dsv41::Server* server = new dsv41::Server;
  const int status = dsv41::exchange(server->port, data, size);
  if (status >= 500) dsv41::fuzz::invariant_failed("the server answered 5xx");
  return 0;
}

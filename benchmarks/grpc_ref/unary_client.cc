// The smallest C-core gRPC client: unary calls at a fixed rate on one channel, one at a time,
// each timed from its send to its status. benchmarks/fidelity.py builds it (Debian's
// libgrpc++-dev) as the gRPC reference the probe's reported latency is compared with.
//
//   unary_client TARGET METHOD CALLS RATE LOG
//
// LOG gets one line per call, "sent_us<TAB>grpc_code<TAB>took_us" (h2load --log-file's
// columns); stdout ends with "requests: N total, K succeeded, E errored, T timeout".
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;

// One call with an empty request message; the generic stub frames it (5-byte prefix).
grpc::Status Call(grpc::GenericStub& stub, grpc::CompletionQueue& cq, const std::string& method,
                  const grpc::ByteBuffer& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  grpc::ByteBuffer response;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  call->Finish(&response, &status, &status);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s TARGET METHOD CALLS RATE LOG\n", argv[0]);
    return 2;
  }
  const std::string target = argv[1];
  const std::string method = argv[2];
  const long calls = std::atol(argv[3]);
  const double rate = std::atof(argv[4]);
  std::ofstream log(argv[5]);
  if (calls <= 0 || rate <= 0 || !log) {
    std::fprintf(stderr, "unary_client: bad CALLS, RATE or LOG\n");
    return 2;
  }
  grpc::GenericStub stub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  grpc::Slice empty("", 0);
  const grpc::ByteBuffer request(&empty, 1);
  Call(stub, cq, method, request);  // connects; not timed, as h2load's connection setup
  long succeeded = 0, errored = 0, timeout = 0;
  const auto start = Clock::now();
  for (long i = 0; i < calls; ++i) {
    std::this_thread::sleep_until(
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(i / rate)));
    const auto sent = Clock::now();
    const grpc::Status status = Call(stub, cq, method, request);
    const auto took = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - sent);
    const auto at = std::chrono::duration_cast<std::chrono::microseconds>(sent - start);
    log << at.count() << '\t' << status.error_code() << '\t' << took.count() << '\n';
    if (status.ok()) {
      ++succeeded;
    } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      ++timeout;
    } else {
      ++errored;
    }
  }
  std::printf("requests: %ld total, %ld succeeded, %ld errored, %ld timeout\n", calls, succeeded,
              errored, timeout);
  return 0;
}

// nwt_native: cupy_nwt's bandwidth and overlap experiments written directly in CUDA C, as the
// reference for what the driver and the link give without Python in the way.
//
//   nwt_native bandwidth [--repeats N] [--warmup N] [--min BYTES] [--max BYTES]
//                        [--batch-total BYTES] [--batch-chunk BYTES] [--device N]
//   nwt_native overlap   [--streams N] [--repeats N] [--warmup N] [--device N]
//   nwt_native --help                   prints this usage
//   nwt_native EXPERIMENT --dry-run     prints the error document and exits 3 without any CUDA call
//   nwt_native summarize X...           prints the statistics of the finite numbers X (the writer, testable anywhere)
//   nwt_native ideal H K D STREAMS RH RD SERIAL
//                                       prints the overlap ideals and the hand-off from those stage
//                                       seconds, duplex ratios and serial-chunks seconds (testable anywhere)
//
// The method is cupy_nwt's, step for step: the same sizes and defaults, the same copies per sample,
// every sample but pageable copies queued behind the same spin kernel (held twice the slowest
// warm-up issue + 200 us),
// CUDA events on the copying stream, medians and inclusive quartiles, every copy checked. The
// kernels are the very files cupy_nwt compiles at run time (#included from cuda_src/). The JSON on
// stdout has the shape of `cupy-nwt bandwidth --json` / `cupy-nwt overlap --json` for every field
// bench/studies/are_transfers_as_fast_as_cuda_c/native_report.py compares, plus "source": "native". `overlap` also runs cupy_nwt's duplex
// stage, the serial chunks (the hand-off) and the ideal rebuilt from them (pipeline_model.py).
//
// Exit: 0 done and every result checked; 1 a CUDA error or a wrong result; 2 bad arguments;
// 3 no usable GPU (or --dry-run). On any exit but 0 stdout holds {"experiment", "source", "error"}.
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "overlap.cu"
#include "spin.cu"

namespace {

const char* g_experiment = "none";

const char* const kUsage =
    "usage: nwt_native bandwidth [--repeats N] [--warmup N] [--min BYTES] [--max BYTES]\n"
    "                            [--batch-total BYTES] [--batch-chunk BYTES] [--device N]\n"
    "       nwt_native overlap   [--streams N] [--repeats N] [--warmup N] [--device N]\n"
    "       nwt_native EXPERIMENT --dry-run       the error document, exit 3, no CUDA call\n"
    "       nwt_native summarize X...             the statistics of the numbers X\n"
    "       nwt_native ideal H K D STREAMS RH RD SERIAL\n"
    "                                             the overlap ideals and the hand-off from those seconds\n"
    "exit: 0 done and checked; 1 a CUDA error or a wrong result; 2 bad arguments; 3 no usable GPU\n";

// ------------------------------------------------------------------ JSON, by hand and small

std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

std::string num(double x) {  // JSON has no inf or nan
    if (!std::isfinite(x)) return "null";
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", x);
    return buf;
}

std::string integer(long long x) { return std::to_string(x); }

std::string boolean(bool b) { return b ? "true" : "false"; }

// {"k": v, ...} from pairs whose values are already JSON.
std::string object(const std::vector<std::pair<std::string, std::string>>& fields) {
    std::string out = "{";
    for (size_t i = 0; i < fields.size(); ++i) {
        out += (i ? ", " : "") + quoted(fields[i].first) + ": " + fields[i].second;
    }
    return out + "}";
}

std::string array(const std::vector<std::string>& items) {
    std::string out = "[";
    for (size_t i = 0; i < items.size(); ++i) out += (i ? ",\n  " : "\n  ") + items[i];
    return out + (items.empty() ? "]" : "\n]");
}

[[noreturn]] void fail(int code, const std::string& why) {
    std::printf("%s\n", object({{"experiment", quoted(g_experiment)}, {"source", quoted("native")},
                                {"error", quoted(why)}}).c_str());
    std::fprintf(stderr, "nwt_native: %s\n", why.c_str());
    std::exit(code);
}

#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t err_ = (call);                                                    \
        if (err_ != cudaSuccess) fail(1, std::string(#call) + ": " + cudaGetErrorString(err_)); \
    } while (0)

// ------------------------------------------------------------------ statistics, as timing.summarize

struct Stats {
    double median = 0, mean = 0, min = 0, max = 0, stdev = 0, p25 = 0, p75 = 0;
    int n = 0;
};

double interpolated(const std::vector<double>& sorted, double q) {  // Python's "inclusive" method
    double pos = q * static_cast<double>(sorted.size() - 1);
    size_t lo = static_cast<size_t>(pos);
    if (lo + 1 >= sorted.size()) return sorted.back();
    return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[lo + 1] - sorted[lo]);
}

Stats summarize(std::vector<double> xs) {
    Stats s;
    std::sort(xs.begin(), xs.end());
    s.n = static_cast<int>(xs.size());
    s.min = xs.front();
    s.max = xs.back();
    for (double x : xs) s.mean += x / s.n;
    double ss = 0;
    for (double x : xs) ss += (x - s.mean) * (x - s.mean);
    s.stdev = s.n > 1 ? std::sqrt(ss / (s.n - 1)) : 0.0;
    s.median = interpolated(xs, 0.5);
    s.p25 = interpolated(xs, 0.25);
    s.p75 = interpolated(xs, 0.75);
    return s;
}

std::string stats_json(const Stats& s) {
    return object({{"median", num(s.median)}, {"mean", num(s.mean)}, {"min", num(s.min)}, {"max", num(s.max)},
                   {"stdev", num(s.stdev)}, {"p25", num(s.p25)}, {"p75", num(s.p75)}, {"n", integer(s.n)}});
}

std::vector<double> scaled(const std::vector<double>& xs, double by) {
    std::vector<double> out;
    for (double x : xs) out.push_back(x * by);
    return out;
}

// ------------------------------------------------------------------ queued timing, as timing.queued_time

double host_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const double kHoldFactor = 2.0, kHoldMarginS = 200e-6;

struct Timer {
    unsigned char* sink = nullptr;
    Timer() { CHECK(cudaMalloc(&sink, 1)); CHECK(cudaMemset(sink, 0, 1)); }
    ~Timer() { cudaFree(sink); }

    void hold(cudaStream_t s, double seconds) const {
        long long ns = std::max(1LL, static_cast<long long>(std::llround(seconds * 1e9)));
        cupy_nwt_spin<<<1, 1, 0, s>>>(reinterpret_cast<unsigned long long>(sink), ns, sink);
        CHECK(cudaGetLastError());
    }

    // Device seconds of what issue() enqueues, window on `s` joined by `others`, behind a hold of
    // `held` seconds (none when 0). With `each`, also every other stream's own seconds from the start
    // to its last work's end (as timing.event_seconds_each).
    template <class F>
    double window(F&& issue, cudaStream_t s, const std::vector<cudaStream_t>& others, double held,
                  double* issued, std::vector<double>* each = nullptr) const {
        cudaEvent_t start, end;
        CHECK(cudaEventCreate(&start));
        CHECK(cudaEventCreate(&end));
        if (held > 0) hold(s, held);
        CHECK(cudaEventRecord(start, s));
        for (cudaStream_t o : others) if (o != s) CHECK(cudaStreamWaitEvent(o, start, 0));
        double t0 = host_now();
        issue();
        *issued = host_now() - t0;
        std::vector<cudaEvent_t> ends;
        for (cudaStream_t o : others) {
            if (o == s) continue;
            cudaEvent_t done;
            CHECK(cudaEventCreateWithFlags(&done, each ? cudaEventDefault : cudaEventDisableTiming));
            CHECK(cudaEventRecord(done, o));
            CHECK(cudaStreamWaitEvent(s, done, 0));
            ends.push_back(done);
        }
        CHECK(cudaEventRecord(end, s));
        CHECK(cudaEventSynchronize(end));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, end));
        if (each) each->clear();
        for (cudaEvent_t done : ends) {
            if (each) {
                float own = 0;
                CHECK(cudaEventElapsedTime(&own, start, done));
                each->push_back(own / 1e3);
            }
            CHECK(cudaEventDestroy(done));
        }
        CHECK(cudaEventDestroy(start));
        CHECK(cudaEventDestroy(end));
        return ms / 1e3;
    }
};

struct Queued {
    std::vector<double> device, issue;
    int overran = 0;
};

// use_hold false: the window alone (pageable copies hold the host until staged; a spin would only add waiting).
template <class F>
Queued queued_time(const Timer& timer, F&& issue, int repeats, int warmup, cudaStream_t s, bool use_hold = true) {
    double slowest = 0;
    for (int i = 0; i < warmup; ++i) {
        double t0 = host_now();
        issue();
        slowest = std::max(slowest, host_now() - t0);
    }
    CHECK(cudaStreamSynchronize(s));
    double held = use_hold ? kHoldFactor * slowest + kHoldMarginS : 0.0;
    Queued q;
    for (int i = 0; i < repeats; ++i) {
        double issued = 0;
        q.device.push_back(timer.window(issue, s, {}, held, &issued));
        q.issue.push_back(issued);
        q.overran += issued > held;
    }
    return q;
}

// ------------------------------------------------------------------ arguments and the device

struct Args {
    long long repeats = 20, warmup = 3, min = 4 * 1024, max = 256LL * 1024 * 1024;
    long long batch_total = 64LL * 1024 * 1024, batch_chunk = 64 * 1024, streams = 4, device = 0;
};

// Counts end up in an int and sizes are doubled up to --max: bounded here, so neither can overflow.
const long long kMostCount = INT_MAX, kMostBytes = 1LL << 62;

// The whole number `text` (digits only, nothing around them) from 0 to `most`, or exit 2 naming `what`.
long long whole(const std::string& what, const char* text, long long most) {
    errno = 0;
    long long v = std::strtoll(text, nullptr, 10);
    bool digits = *text && std::strspn(text, "0123456789") == std::strlen(text);
    if (!digits || errno == ERANGE || v > most)
        fail(2, what + " needs a whole number from 0 to " + std::to_string(most) + ", got '" + text + "'");
    return v;
}

// The finite number `text` (as strtod reads it, nothing after it), or exit 2.
double real(const char* text) {
    char* end = nullptr;
    double v = std::strtod(text, &end);
    if (!*text || end == text || *end || !std::isfinite(v))
        fail(2, std::string("not a finite number: '") + text + "'");
    return v;
}

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 2; i < argc; ++i) {
        std::string k = argv[i];
        if (k == "--dry-run") fail(3, "dry run: no CUDA call was made");
        long long* count = k == "--repeats" ? &a.repeats : k == "--warmup" ? &a.warmup : k == "--streams" ? &a.streams
                           : k == "--device" ? &a.device : nullptr;
        long long* bytes = k == "--min" ? &a.min : k == "--max" ? &a.max : k == "--batch-total" ? &a.batch_total
                           : k == "--batch-chunk" ? &a.batch_chunk : nullptr;
        if (i + 1 >= argc) fail(2, "option " + k + " needs a value");
        if (!count && !bytes) fail(2, "unknown option " + k);
        *(count ? count : bytes) = whole("option " + k, argv[++i], count ? kMostCount : kMostBytes);
    }
    if (a.repeats < 1 || a.min < 1 || a.max < a.min || a.streams < 1 || a.batch_chunk < 1 ||
        a.batch_total < a.batch_chunk || a.batch_total % a.batch_chunk)
        fail(2, "need repeats >= 1, 0 < min <= max, streams >= 1, batch-total a whole multiple of batch-chunk");
    return a;
}

std::string use_device(int device) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) fail(3, std::string("no usable GPU: ") + cudaGetErrorString(err));
    if (count == 0) fail(3, "no usable GPU: the driver found no CUDA device");
    if (device >= count) fail(2, "there is no GPU " + std::to_string(device));
    CHECK(cudaSetDevice(device));
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, device));
    char bus[32] = {0};
    CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
    return object({{"index", integer(device)}, {"name", quoted(p.name)},
                   {"compute_capability", quoted(std::to_string(p.major) + "." + std::to_string(p.minor))},
                   {"total_memory_bytes", integer(static_cast<long long>(p.totalGlobalMem))},
                   {"copy_engines", integer(p.asyncEngineCount)}, {"multiprocessors", integer(p.multiProcessorCount)},
                   {"pci_bus_id", quoted(bus)}});
}

// ------------------------------------------------------------------ bandwidth

const long long kSampleTargetBytes = 8LL * 1024 * 1024, kMaxCopiesPerSample = 256;

long long copies_per_sample(long long nbytes) {
    return std::max(1LL, std::min(kMaxCopiesPerSample, (kSampleTargetBytes + nbytes - 1) / nbytes));
}

struct Host {
    unsigned char *src, *dst;
};

std::string point(const char* dir, const char* memory, long long n, long long k, const std::vector<double>& per_copy,
                  bool ok) {
    std::vector<double> gbps;
    for (double t : per_copy) gbps.push_back(t > 0 ? n / t / 1e9 : INFINITY);
    return object({{"direction", quoted(dir)}, {"memory", quoted(memory)}, {"nbytes", integer(n)},
                   {"copies_per_sample", integer(k)}, {"seconds", stats_json(summarize(per_copy))},
                   {"gbps", stats_json(summarize(gbps))}, {"verified", boolean(ok)}});
}

int bandwidth(const Args& a, const std::string& device) {
    std::vector<long long> sizes;
    for (long long n = a.min; n < a.max; n *= 2) sizes.push_back(n);
    sizes.push_back(a.max);
    size_t cap = static_cast<size_t>(std::max(a.max, a.batch_total));
    const int reps = static_cast<int>(a.repeats), warm = static_cast<int>(a.warmup);
    unsigned char* dev = nullptr;
    CHECK(cudaMalloc(&dev, cap));
    Host page{static_cast<unsigned char*>(std::malloc(cap)), static_cast<unsigned char*>(std::malloc(cap))}, pin{};
    if (!page.src || !page.dst) fail(1, "out of host memory");
    CHECK(cudaMallocHost(&pin.src, cap));
    CHECK(cudaMallocHost(&pin.dst, cap));
    unsigned long long x = 88172645463325252ULL;  // xorshift: bytes a copy cannot fake
    for (size_t i = 0; i < cap; ++i) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        page.src[i] = pin.src[i] = static_cast<unsigned char>(x);
    }
    std::memset(page.dst, 0, cap);  // every page touched now, not inside a timed copy
    std::memset(pin.dst, 0, cap);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Timer timer;
    const char* memories[2] = {"pageable", "pinned"};
    Host hosts[2] = {page, pin};
    bool all_ok = true;
    std::vector<std::string> points, batching;
    for (long long n : sizes) {
        for (int m = 0; m < 2; ++m) {
            Host h = hosts[m];
            long long k = copies_per_sample(n);
            CHECK(cudaMemsetAsync(dev, 0, n, s));
            std::memset(h.dst, 0, n);
            auto up = queued_time(timer, [&] {
                for (long long i = 0; i < k; ++i) CHECK(cudaMemcpyAsync(dev, h.src, n, cudaMemcpyHostToDevice, s));
            }, reps, warm, s, m == 1);
            auto down = queued_time(timer, [&] {
                for (long long i = 0; i < k; ++i) CHECK(cudaMemcpyAsync(h.dst, dev, n, cudaMemcpyDeviceToHost, s));
            }, reps, warm, s, m == 1);
            CHECK(cudaStreamSynchronize(s));
            bool ok = std::memcmp(h.dst, h.src, n) == 0;
            all_ok = all_ok && ok;
            points.push_back(point("h2d", memories[m], n, k, scaled(up.device, 1.0 / k), ok));
            points.push_back(point("d2h", memories[m], n, k, scaled(down.device, 1.0 / k), ok));
        }
    }
    const long long total = a.batch_total, chunk = a.batch_chunk;
    for (int m = 0; m < 2; ++m) {
        Host h = hosts[m];
        for (int up = 1; up >= 0; --up) {
            cudaMemcpyKind kind = up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
            if (!up) CHECK(cudaMemcpyAsync(dev, h.src, total, cudaMemcpyHostToDevice, s));  // the pattern to copy back
            Stats st[2];
            bool ok = true;
            for (int many = 0; many < 2; ++many) {
                long long piece = many ? chunk : total;
                CHECK(cudaStreamSynchronize(s));
                if (up) CHECK(cudaMemsetAsync(dev, 0, total, s)); else std::memset(h.dst, 0, total);
                auto q = queued_time(timer, [&] {
                    for (long long o = 0; o < total; o += piece) {
                        void* to = up ? static_cast<void*>(dev + o) : static_cast<void*>(h.dst + o);
                        const void* from = up ? static_cast<const void*>(h.src + o) : static_cast<const void*>(dev + o);
                        CHECK(cudaMemcpyAsync(to, from, piece, kind, s));
                    }
                }, reps, warm, s, m == 1);
                st[many] = summarize(q.device);
                if (up) {
                    CHECK(cudaStreamSynchronize(s));
                    std::memset(h.dst, 0, total);
                    CHECK(cudaMemcpyAsync(h.dst, dev, total, cudaMemcpyDeviceToHost, s));
                }
                CHECK(cudaStreamSynchronize(s));
                ok = ok && std::memcmp(h.dst, h.src, total) == 0;
            }
            all_ok = all_ok && ok;
            batching.push_back(object({
                {"direction", quoted(up ? "h2d" : "d2h")}, {"memory", quoted(memories[m])},
                {"total_bytes", integer(total)}, {"chunk_bytes", integer(chunk)}, {"chunks", integer(total / chunk)},
                {"one_copy_seconds", stats_json(st[0])}, {"many_copies_seconds", stats_json(st[1])},
                {"one_copy_gbps", num(total / st[0].median / 1e9)}, {"many_copies_gbps", num(total / st[1].median / 1e9)},
                {"slowdown", num(st[1].median / st[0].median)}, {"verified", boolean(ok)}}));
        }
    }
    std::vector<std::string> size_list;
    for (long long n : sizes) size_list.push_back(integer(n));
    std::string sizes_json = "[";
    for (size_t i = 0; i < size_list.size(); ++i) sizes_json += (i ? ", " : "") + size_list[i];
    sizes_json += "]";
    std::printf("%s\n", object({
        {"experiment", quoted("bandwidth")}, {"source", quoted("native")},
        {"config", object({{"sizes", sizes_json}, {"repeats", integer(a.repeats)}, {"warmup", integer(a.warmup)},
                           {"device", integer(a.device)}, {"batch_total", integer(total)},
                           {"batch_chunk", integer(chunk)}})},
        {"device", device}, {"verified", boolean(all_ok)}, {"points", array(points)},
        {"batching", array(batching)}}).c_str());
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost(pin.src));
    CHECK(cudaFreeHost(pin.dst));
    std::free(page.src);
    std::free(page.dst);
    CHECK(cudaFree(dev));
    if (!all_ok) std::fprintf(stderr, "nwt_native: MISMATCH: copied bytes differ\n");
    return all_ok ? 0 : 1;
}

// ------------------------------------------------------------------ overlap

const long long kChunkElements = 4 * 1024 * 256;
const int kBlock = 256, kStageRepeats = 8;
const double kMaxError = 1e-5;

void launch(float* chunk, long long offset, long long n, cudaStream_t s) {
    cupy_nwt_overlap<<<static_cast<unsigned>((n + kBlock - 1) / kBlock), kBlock, 0, s>>>(chunk, offset, n);
    CHECK(cudaGetLastError());
}

// The duplex stage, as cupy_nwt's duplex.measure_duplex: per size, rounds of H2D alone, D2H alone and
// both at once on two streams, `copies` back-to-back copies each way a sample, behind the hold.
struct DuplexPoint {
    long long nbytes = 0;
    Stats h2d_alone, d2h_alone, h2d_duplex, d2h_duplex, both;
    bool verified = false;
};

double gbps_of(long long n, const Stats& s) { return s.median > 0 ? n / s.median / 1e9 : INFINITY; }

std::string duplex_json(const DuplexPoint& p, int copies) {
    return object({
        {"nbytes", integer(p.nbytes)}, {"copies_per_sample", integer(copies)},
        {"seconds", object({{"h2d_alone", stats_json(p.h2d_alone)}, {"d2h_alone", stats_json(p.d2h_alone)},
                            {"h2d_duplex", stats_json(p.h2d_duplex)}, {"d2h_duplex", stats_json(p.d2h_duplex)},
                            {"both", stats_json(p.both)}})},
        {"gbps", object({{"h2d_alone", num(gbps_of(p.nbytes, p.h2d_alone))},
                         {"d2h_alone", num(gbps_of(p.nbytes, p.d2h_alone))},
                         {"h2d_duplex", num(gbps_of(p.nbytes, p.h2d_duplex))},
                         {"d2h_duplex", num(gbps_of(p.nbytes, p.d2h_duplex))},
                         {"both_ways", num(2 * gbps_of(p.nbytes, p.both))}})},
        {"duplex_ratio", object({{"h2d", num(p.h2d_duplex.median / p.h2d_alone.median)},
                                 {"d2h", num(p.d2h_duplex.median / p.d2h_alone.median)}})},
        {"verified", boolean(p.verified)}});
}

std::vector<DuplexPoint> measure_duplex(const Timer& timer, const std::vector<long long>& sizes, int copies,
                                        int reps, int warm, int* overran) {
    const long long n = *std::max_element(sizes.begin(), sizes.end());
    unsigned char *host_up = nullptr, *host_down = nullptr, *dev_up = nullptr, *dev_down = nullptr;
    CHECK(cudaMallocHost(&host_up, n));
    CHECK(cudaMallocHost(&host_down, n));
    CHECK(cudaMalloc(&dev_up, n));
    CHECK(cudaMalloc(&dev_down, n));
    unsigned long long x = 88172645463325252ULL;
    for (long long i = 0; i < n; ++i) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        host_up[i] = static_cast<unsigned char>(x);
    }
    cudaStream_t main_s, sa, sb;
    for (cudaStream_t* st : {&main_s, &sa, &sb}) CHECK(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
    CHECK(cudaMemcpyAsync(dev_down, host_up, n, cudaMemcpyHostToDevice, main_s));  // what the D2H copies bring back
    CHECK(cudaStreamSynchronize(main_s));
    std::vector<DuplexPoint> points;
    for (long long m : sizes) {
        std::memset(host_down, 0, m);
        CHECK(cudaMemsetAsync(dev_up, 0, m, main_s));  // zeros: a copy that never ran shows
        CHECK(cudaStreamSynchronize(main_s));
        auto up = [&] { for (int i = 0; i < copies; ++i) CHECK(cudaMemcpyAsync(dev_up, host_up, m, cudaMemcpyHostToDevice, sa)); };
        auto down = [&] { for (int i = 0; i < copies; ++i) CHECK(cudaMemcpyAsync(host_down, dev_down, m, cudaMemcpyDeviceToHost, sb)); };
        auto both = [&] { up(); down(); };
        std::vector<double> h_alone, d_alone, h_dx, d_dx, pair, each;
        double slowest = 0;
        for (int i = 0; i < warm + reps; ++i) {
            for (int which = 0; which < 3; ++which) {
                double held = kHoldFactor * slowest + kHoldMarginS, issued = 0, total = 0;
                if (which == 0) total = timer.window(up, main_s, {sa, sb}, held, &issued, &each);
                else if (which == 1) total = timer.window(down, main_s, {sa, sb}, held, &issued, &each);
                else total = timer.window(both, main_s, {sa, sb}, held, &issued, &each);
                slowest = std::max(slowest, issued);
                if (i < warm) continue;
                *overran += issued > held;
                if (which == 0) h_alone.push_back(total / copies);
                else if (which == 1) d_alone.push_back(total / copies);
                else {
                    h_dx.push_back(each[0] / copies);
                    d_dx.push_back(each[1] / copies);
                    pair.push_back(total / copies);
                }
            }
        }
        CHECK(cudaDeviceSynchronize());
        std::vector<unsigned char> arrived(static_cast<size_t>(m));
        CHECK(cudaMemcpy(arrived.data(), dev_up, m, cudaMemcpyDeviceToHost));
        bool ok = std::memcmp(arrived.data(), host_up, m) == 0 && std::memcmp(host_down, host_up, m) == 0;
        points.push_back({m, summarize(h_alone), summarize(d_alone), summarize(h_dx), summarize(d_dx),
                          summarize(pair), ok});
    }
    for (cudaStream_t st : {main_s, sa, sb}) CHECK(cudaStreamDestroy(st));
    CHECK(cudaFreeHost(host_up));
    CHECK(cudaFreeHost(host_down));
    CHECK(cudaFree(dev_up));
    CHECK(cudaFree(dev_down));
    return points;
}

// pipeline_model.py's arithmetic, term for term.
const int kHandoffsOnTheFill = 2;

double handoff_seconds(double serial, double h, double k, double d, int chunks) {
    if (chunks == 1) return (serial - (h + k + d)) / 2;
    return (serial - chunks * (h + k + d)) / (3 * chunks - 1);
}

double measured_ideal(double h, double k, double d, int S, double rh, double rd, double hop) {
    return (h + k + d + kHandoffsOnTheFill * hop) + (S - 1) * std::max(h * rh, std::max(k, d * rd));
}

std::string share(double part, double excess) { return excess > 0 ? num(part / excess) : "null"; }

int overlap(const Args& a, const std::string& device) {
    const int S = static_cast<int>(a.streams), reps = static_cast<int>(a.repeats), warm = static_cast<int>(a.warmup);
    const long long chunk = kChunkElements, n = chunk * S;
    const size_t cb = chunk * sizeof(float), nb = n * sizeof(float);
    float *host = nullptr, *dev = nullptr;
    CHECK(cudaMallocHost(&host, nb));
    CHECK(cudaMalloc(&dev, nb));
    std::memset(host, 0, nb);
    cudaStream_t main_s;
    CHECK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
    std::vector<cudaStream_t> streams(S);
    for (auto& st : streams) CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Timer timer;
    cudaStream_t s0 = streams[0];

    auto h2d0 = [&] { CHECK(cudaMemcpyAsync(dev, host, cb, cudaMemcpyHostToDevice, s0)); };
    auto k0 = [&] { launch(dev, 0, chunk, s0); };
    auto d2h0 = [&] { CHECK(cudaMemcpyAsync(host, dev, cb, cudaMemcpyDeviceToHost, s0)); };
    Stats stage[3], launch_s[3];
    int overran = 0, which = 0;
    auto time_stage = [&](auto one) {
        auto q = queued_time(timer, [&] { for (int i = 0; i < kStageRepeats; ++i) one(); }, reps, std::max(warm, 1), s0);
        stage[which] = summarize(scaled(q.device, 1.0 / kStageRepeats));
        launch_s[which] = summarize(scaled(q.issue, 1.0 / kStageRepeats));
        overran += q.overran;
        ++which;
    };
    time_stage(h2d0);
    time_stage(k0);
    time_stage(d2h0);

    auto sequential = [&] {
        CHECK(cudaMemcpyAsync(dev, host, nb, cudaMemcpyHostToDevice, main_s));
        launch(dev, 0, n, main_s);
        CHECK(cudaMemcpyAsync(host, dev, nb, cudaMemcpyDeviceToHost, main_s));
    };
    auto async_v1 = [&] {
        for (int i = 0; i < S; ++i) {
            CHECK(cudaMemcpyAsync(dev + i * chunk, host + i * chunk, cb, cudaMemcpyHostToDevice, streams[i]));
            launch(dev + i * chunk, i * chunk, chunk, streams[i]);
            CHECK(cudaMemcpyAsync(host + i * chunk, dev + i * chunk, cb, cudaMemcpyDeviceToHost, streams[i]));
        }
    };
    auto async_v2 = [&] {
        for (int i = 0; i < S; ++i)
            CHECK(cudaMemcpyAsync(dev + i * chunk, host + i * chunk, cb, cudaMemcpyHostToDevice, streams[i]));
        for (int i = 0; i < S; ++i) launch(dev + i * chunk, i * chunk, chunk, streams[i]);
        for (int i = 0; i < S; ++i)
            CHECK(cudaMemcpyAsync(host + i * chunk, dev + i * chunk, cb, cudaMemcpyDeviceToHost, streams[i]));
    };
    struct Version { const char* name; Stats seconds; double max_error; };
    std::vector<Version> versions;
    auto time_version = [&](const char* name, auto work, const std::vector<cudaStream_t>& used) {
        std::vector<double> times;
        double worst = 0, slowest = 0;
        for (int i = 0; i < warm + reps; ++i) {
            std::memset(host, 0, nb);
            double held = kHoldFactor * slowest + kHoldMarginS, issued = 0;
            double t = timer.window(work, main_s, used, held, &issued);
            for (long long j = 0; j < n; ++j) worst = std::max(worst, static_cast<double>(std::fabs(host[j] - 1.0f)));
            if (i >= warm) {
                times.push_back(t);
                overran += issued > held;
            }
            slowest = std::max(slowest, issued);
        }
        versions.push_back({name, summarize(times), worst});
    };
    // async_v1's work on one stream: no two stages at once, so beyond the stages only hand-offs remain.
    auto serial_chunks = [&] {
        for (int i = 0; i < S; ++i) {
            CHECK(cudaMemcpyAsync(dev + i * chunk, host + i * chunk, cb, cudaMemcpyHostToDevice, main_s));
            launch(dev + i * chunk, i * chunk, chunk, main_s);
            CHECK(cudaMemcpyAsync(host + i * chunk, dev + i * chunk, cb, cudaMemcpyDeviceToHost, main_s));
        }
    };
    time_version("sequential", sequential, {main_s});
    time_version("async_v1", async_v1, streams);
    time_version("async_v2", async_v2, streams);
    time_version("serial_chunks", serial_chunks, {main_s});
    const Version serial = versions.back();
    versions.pop_back();
    std::vector<long long> sizes = {static_cast<long long>(cb)};
    if (nb != cb) sizes.push_back(static_cast<long long>(nb));
    std::vector<DuplexPoint> duplex = measure_duplex(timer, sizes, kStageRepeats, reps, warm, &overran);

    double h = stage[0].median, k = stage[1].median, d = stage[2].median;
    double ideal = (h + k + d) + (S - 1) * std::max(h, std::max(k, d));
    const DuplexPoint& dx = duplex.front();  // the chunk size
    double rh = dx.h2d_duplex.median / dx.h2d_alone.median, rd = dx.d2h_duplex.median / dx.d2h_alone.median;
    double hop = handoff_seconds(serial.seconds.median, h, k, d, S);
    double duplex_ideal = measured_ideal(h, k, d, S, rh, rd, 0.0), full_ideal = measured_ideal(h, k, d, S, rh, rd, hop);
    double worst = serial.max_error;
    std::vector<std::string> vj;
    for (const auto& v : versions) {
        worst = std::max(worst, v.max_error);
        double t = v.seconds.median, excess = t - ideal;
        std::string explained = std::string(v.name) == "sequential" ? "null" : object({
            {"version", quoted(v.name)}, {"excess_seconds", num(excess)},
            {"by_duplex", share(duplex_ideal - ideal, excess)}, {"by_handoff", share(full_ideal - duplex_ideal, excess)},
            {"unexplained", share(t - full_ideal, excess)}, {"vs_measured_ideal", num(t / full_ideal)},
            {"crossings_for_the_rest", hop > 0 && t > duplex_ideal ? num((t - duplex_ideal) / hop) : "null"}});
        vj.push_back(object({{"name", quoted(v.name)}, {"seconds", stats_json(v.seconds)},
                             {"max_error", num(v.max_error)},
                             {"speedup_vs_sequential", num(versions[0].seconds.median / t)},
                             {"vs_ideal", num(t / ideal)}, {"excess_explained", explained}}));
    }
    std::vector<std::string> dj;
    bool duplex_ok = true;
    for (const auto& p : duplex) {
        dj.push_back(duplex_json(p, kStageRepeats));
        duplex_ok = duplex_ok && p.verified;
    }
    const char* names[3] = {"h2d", "kernel", "d2h"};
    std::vector<std::pair<std::string, std::string>> stages, launches;
    for (int i = 0; i < 3; ++i) {
        stages.push_back({names[i], stats_json(stage[i])});
        launches.push_back({names[i], stats_json(launch_s[i])});
    }
    bool correct = worst < kMaxError && duplex_ok;
    std::printf("%s\n", object({
        {"experiment", quoted("overlap")}, {"source", quoted("native")},
        {"config", object({{"streams", integer(S)}, {"elements", integer(n)}, {"repeats", integer(reps)},
                           {"warmup", integer(warm)}, {"device", integer(a.device)},
                           {"chunk_elements", integer(chunk)}, {"nbytes", integer(static_cast<long long>(nb))}})},
        {"device", device}, {"stages", object(stages)},
        {"timing", quoted("device time with the work queued behind a spin kernel: no launch time inside")},
        {"launch_seconds", object(launches)}, {"overran_samples", integer(overran)},
        {"ideal_seconds", num(ideal)},
        {"duplex", array(dj)},
        {"handoff", object({{"serial_chunks", object({{"name", quoted(serial.name)},
                                                      {"seconds", stats_json(serial.seconds)},
                                                      {"max_error", num(serial.max_error)}})},
                            {"chunks", integer(S)}, {"seconds", num(hop)}})},
        {"ideal_from_measured_stages", object({{"duplex_seconds", num(duplex_ideal)}, {"seconds", num(full_ideal)}})},
        {"max_error", num(worst)}, {"max_error_tolerance", num(kMaxError)},
        {"correct", boolean(correct)}, {"versions", array(vj)}}).c_str());
    for (auto st : streams) CHECK(cudaStreamDestroy(st));
    CHECK(cudaStreamDestroy(main_s));
    CHECK(cudaFreeHost(host));
    CHECK(cudaFree(dev));
    if (worst >= kMaxError) std::fprintf(stderr, "nwt_native: WRONG result: max error %g\n", worst);
    if (!duplex_ok) std::fprintf(stderr, "nwt_native: MISMATCH: duplex copies brought back other bytes\n");
    return correct ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    std::string what = argc > 1 ? argv[1] : "";
    if (what == "-h" || what == "--help") {
        std::printf("%s", kUsage);
        return 0;
    }
    if (what == "summarize" && argc > 2) {
        std::vector<double> xs;
        for (int i = 2; i < argc; ++i) xs.push_back(real(argv[i]));
        std::printf("%s\n", stats_json(summarize(xs)).c_str());
        return 0;
    }
    if (what == "ideal" && argc == 9) {
        double x[7];
        for (int i = 0; i < 7; ++i) x[i] = i == 3 ? 0 : real(argv[i + 2]);
        const int S = static_cast<int>(whole("streams", argv[5], kMostCount));
        if (S < 1 || x[0] < 0 || x[1] < 0 || x[2] < 0 || x[4] <= 0 || x[5] <= 0)
            fail(2, "need stage seconds >= 0, streams >= 1 and positive duplex ratios");
        double hop = handoff_seconds(x[6], x[0], x[1], x[2], S);
        std::printf("%s\n", object({{"ideal_seconds", num(measured_ideal(x[0], x[1], x[2], S, 1, 1, 0))},
                                     {"duplex_seconds", num(measured_ideal(x[0], x[1], x[2], S, x[4], x[5], 0))},
                                     {"handoff_seconds", num(hop)},
                                     {"seconds", num(measured_ideal(x[0], x[1], x[2], S, x[4], x[5], hop))}}).c_str());
        return 0;
    }
    if (what != "bandwidth" && what != "overlap") {
        std::fprintf(stderr, "%s", kUsage);
        fail(2, "the first argument must be 'bandwidth' or 'overlap'");
    }
    g_experiment = what == "bandwidth" ? "bandwidth" : "overlap";
    Args a = parse(argc, argv);
    std::string device = use_device(static_cast<int>(a.device));
    return what == "bandwidth" ? bandwidth(a, device) : overlap(a, device);
}

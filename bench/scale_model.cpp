// SPDX-License-Identifier: Apache-2.0
// squall-scale-model: predicts dense, allgather top-k and gTop-k allreduce times from squall's
// schedules (bench/scale_model.hpp has the model), to check against measurements and to carry
// them to scales this machine cannot emulate.
//
//   squall-scale-model --check FILE.csv [--rate 1gbit] [--latency-us 20] [--merge-gbs 1]
//       [--fill-gbs 10]
//       every row of a squall-bench CSV (dense ring rows, and topk rows gathered or gTop-k)
//       predicted beside its measurement: the transfer phase from the schedule, the link and
//       the latency; encode and decode taken from the row's own split (their rates are what
//       the model is told, not what it predicts), so predicted against measured is the
//       schedule's part of the time.
//   squall-scale-model --paper [--rate 1gbit] [--ranks 8,16,32] [--density 0.001]
//       [--encode-gbs X] [--decode-gbs Y] [--merge-gbs Z] [--fill-gbs W] [--scatter-meps S]
//       [--latency-us 20]
//       the gTop-k paper's models (Shi et al., ICDCS 2019: their gradient sizes and single-GPU
//       iteration times, from the gtopkssgd repository's scripts) on P hosts: each
//       algorithm's communication time, the scaling efficiency of synchronous SGD
//       (compute / (compute + communication)), and gTop-k's efficiency over dense's and over
//       allgather top-k's, beside the paper's measured ratios.
//
// Rates are tc's units (1gbit, 10gbit, 100mbit); the payload rate is 95.6% of it (1448 bytes
// of TCP payload in a 1514-byte frame, as the emulated cluster's ping-pong measured).
#include "scale_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "link_rate.hpp"

namespace {

using squall_model::machine;
using squall_model::prediction;

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "squall-scale-model: %s\nusage: squall-scale-model --check FILE.csv | --paper "
      "[--rate 1gbit] [--latency-us 20] [--ranks 8,16,32] [--density 0.001] "
      "[--encode-gbs X] [--decode-gbs Y] [--merge-gbs Z] [--fill-gbs W] [--scatter-meps S]\n",
      why.c_str());
  std::exit(2);
}

double number(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v > 0) || !std::isfinite(v)) {
    usage("bad " + what + " '" + text + "'");
  }
  return v;
}

double rate_bits(const std::string& text) {
  const double bits = squall_bench::link_rate_bits(text, false);
  if (bits == 0) usage("bad rate '" + text + "' (e.g. 100mbit, 1gbit, 10gbit)");
  return bits;
}

std::vector<std::string> split(const std::string& line, char by) {
  std::vector<std::string> out;
  std::stringstream in(line);
  for (std::string field; std::getline(in, field, by);) out.push_back(field);
  if (!line.empty() && line.back() == by) out.emplace_back();
  return out;
}

std::size_t entries(double density, std::size_t count) {
  return std::max<std::size_t>(
      1, static_cast<std::size_t>(std::llround(density * static_cast<double>(count))));
}

int check(const std::string& file, machine m) {
  std::ifstream in(file);
  if (!in) usage("cannot read " + file);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = split(line, ',');
  std::map<std::string, std::size_t> at;
  for (std::size_t i = 0; i < header.size(); ++i) at[header[i]] = i;
  for (const char* need : {"topology", "compressor", "ranks", "size_bytes", "time_us", "encode_us",
                           "transfer_us", "decode_us"}) {
    if (at.count(need) == 0) usage(file + " has no column '" + need + "' (squall-bench --csv)");
  }
  std::printf("# link %.3f Gbit/s of payload, latency %.1f us, merge %.2f GB/s, fill %.1f GB/s\n",
              m.rate * 8 / 1e9, m.latency * 1e6, m.merge_rate / 1e9, m.fill_rate / 1e9);
  std::printf("# %3s %10s %20s %12s %12s %8s %12s %12s %8s\n", "P", "bytes", "algorithm", "xfer_us",
              "model_xfer", "ratio", "time_us", "model_time", "ratio");
  int rows = 0;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = split(line, ',');
    if (f.size() < header.size()) continue;
    const std::string compressor = f[at["compressor"]];
    const std::string topology = f[at["topology"]];
    const int p = std::atoi(f[at["ranks"]].c_str());
    const auto bytes = static_cast<std::size_t>(std::atoll(f[at["size_bytes"]].c_str()));
    const double time = std::atof(f[at["time_us"]].c_str()) * 1e-6;
    prediction got;
    prediction model;
    std::string algorithm;
    if (compressor == "none" && topology == "ring") {
      algorithm = "dense ring";
      got.transfer = time;
      model = squall_model::dense(squall::ring_topology{}, p, bytes, m);
    } else if (compressor.rfind("topk:", 0) == 0) {
      const bool merged = compressor.find("@gtopk") != std::string::npos;
      const double density = std::atof(compressor.c_str() + 5);
      got.encode = std::atof(f[at["encode_us"]].c_str()) * 1e-6;
      got.transfer = std::atof(f[at["transfer_us"]].c_str()) * 1e-6;
      got.decode = std::atof(f[at["decode_us"]].c_str()) * 1e-6;
      const std::size_t k = entries(density, bytes / 4);
      const std::string ratio(compressor.c_str() + 5, compressor.find('+') - 5);
      if (merged) {
        algorithm = "gtopk " + ratio;
        model = squall_model::gtopk(p, bytes, k, 4, m);
      } else {
        algorithm = "gather " + ratio;
        model = squall_model::gather_topk(squall::ring_topology{}, p, bytes, k, 4, m);
      }
      // the compute the row measured is what the model is told: the transfer is predicted
      model.encode = got.encode;
      model.decode = got.decode;
    } else {
      continue;
    }
    ++rows;
    std::printf("  %3d %10zu %20s %12.0f %12.0f %8.2f %12.0f %12.0f %8.2f\n", p, bytes,
                algorithm.c_str(), got.transfer * 1e6, model.transfer * 1e6,
                model.transfer / got.transfer, time * 1e6, model.total() * 1e6,
                model.total() / time);
  }
  if (rows == 0) usage(file + " has no dense ring or topk row");
  return 0;
}

// The gTop-k paper's models: parameters, batch size, single-GPU throughput (samples/s) and
// the per-worker throughput its 1 Gbit/s cluster measured for dense, allgather top-k and
// gTop-k S-SGD at 4, 8, 16 and 32 workers (gtopkssgd, scripts/icdcs2019/communication.py,
// realdata_speedup; density 0.001).
struct paper_model {
  const char* name;
  double parameters;
  double batch;
  double single;
  double dense[4];
  double topk[4];
  double gtopk[4];
};
const paper_model paper_models[] = {
    {"VGG-16",
     14.73e6,
     128,
     1317.333,
     {104.200, 92.560, 39.480, 12.600},
     {110.576, 109.900, 97.865, 63.002},
     {131.060, 130.551, 126.434, 123.200}},
    {"ResNet-20",
     0.27e6,
     32,
     920.632,
     {821.700, 705.200, 520.400, 287.900},
     {908.837, 752.985, 737.594, 696.029},
     {916.260, 868.730, 808.500, 789.300}},
    {"AlexNet",
     61.10e6,
     32,
     173.469,
     {14.010, 12.118, 4.936, 1.234},
     {14.238, 13.865, 13.352, 9.236},
     {16.536, 16.446, 16.359, 15.777}},
    {"ResNet-50",
     25.56e6,
     32,
     52.873,
     {39.002, 36.989, 23.176, 10.721},
     {37.729, 35.703, 34.495, 30.583},
     {39.795, 39.713, 39.060, 39.119}},
    {"LSTM-PTB",
     66.03e6,
     32,
     392.0,
     {12.657, 8.7, 4.1, 2.1},
     {19.9, 18.6, 14.8, 5.4},
     {17.8, 17.6, 15.1, 10.8}},
};

int paper(const machine& m, const std::vector<int>& ranks, double density) {
  std::printf(
      "# link %.3f Gbit/s of payload, latency %.1f us; encode %.2f GB/s, decode %.2f GB/s, "
      "scatter-add %.0f M entries/s, merge %.2f GB/s, fill %.1f GB/s; density %g\n",
      m.rate * 8 / 1e9, m.latency * 1e6, m.encode_rate / 1e9, m.decode_rate / 1e9,
      m.scatter_rate / 1e6, m.merge_rate / 1e9, m.fill_rate / 1e9, density);
  std::printf(
      "# efficiency = compute / (compute + communication); paper: its measured "
      "per-worker throughput over one GPU's\n");
  std::printf("# %10s %3s %9s %10s %10s %10s %7s %7s %7s %11s %11s %11s %11s\n", "model", "P",
              "comp_ms", "dense_ms", "topk_ms", "gtopk_ms", "e_dense", "e_topk", "e_gtopk",
              "g/dense", "paper", "g/topk", "paper");
  for (const paper_model& pm : paper_models) {
    const double compute = pm.batch / pm.single;
    const auto count = static_cast<std::size_t>(pm.parameters);
    const std::size_t bytes = count * 4;
    const std::size_t k = entries(density, count);
    for (const int p : ranks) {
      const double dense = squall_model::dense(squall::ring_topology{}, p, bytes, m).total();
      const double topk =
          squall_model::gather_topk(squall::ring_topology{}, p, bytes, k, 4, m).total();
      const double gtopk = squall_model::gtopk(p, bytes, k, 4, m).total();
      const double ed = compute / (compute + dense);
      const double et = compute / (compute + topk);
      const double eg = compute / (compute + gtopk);
      const int column = p == 4 ? 0 : p == 8 ? 1 : p == 16 ? 2 : p == 32 ? 3 : -1;
      char paper_dense[16] = "-";
      char paper_topk[16] = "-";
      if (column >= 0) {
        std::snprintf(paper_dense, sizeof paper_dense, "%.2f", pm.gtopk[column] / pm.dense[column]);
        std::snprintf(paper_topk, sizeof paper_topk, "%.2f", pm.gtopk[column] / pm.topk[column]);
      }
      std::printf(
          "  %10s %3d %9.1f %10.1f %10.1f %10.1f %7.3f %7.3f %7.3f %11.2f %11s %11.2f "
          "%11s\n",
          pm.name, p, compute * 1e3, dense * 1e3, topk * 1e3, gtopk * 1e3, ed, et, eg, eg / ed,
          paper_dense, eg / et, paper_topk);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  machine m;
  std::string check_file;
  bool paper_mode = false;
  std::vector<int> ranks = {8, 16, 32};
  double density = 0.001;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--check")
      check_file = value();
    else if (a == "--paper")
      paper_mode = true;
    else if (a == "--rate")
      m.rate = rate_bits(value()) * 0.956 / 8;
    else if (a == "--latency-us")
      m.latency = number(value(), "latency") * 1e-6;
    else if (a == "--encode-gbs")
      m.encode_rate = number(value(), "encode rate") * 1e9;
    else if (a == "--decode-gbs")
      m.decode_rate = number(value(), "decode rate") * 1e9;
    else if (a == "--merge-gbs")
      m.merge_rate = number(value(), "merge rate") * 1e9;
    else if (a == "--fill-gbs")
      m.fill_rate = number(value(), "fill rate") * 1e9;
    else if (a == "--scatter-meps")
      m.scatter_rate = number(value(), "scatter rate") * 1e6;
    else if (a == "--density")
      density = number(value(), "density");
    else if (a == "--ranks") {
      ranks.clear();
      for (const std::string& r : split(value(), ',')) {
        const int p = static_cast<int>(number(r, "rank count"));
        if (p < 2 || p > 4096) usage("--ranks takes counts from 2 to 4096, not '" + r + "'");
        ranks.push_back(p);
      }
    } else if (a == "-h" || a == "--help")
      usage("help");
    else
      usage("unknown argument '" + a + "'");
  }
  if (density > 1) usage("--density must be at most 1");
  if (!check_file.empty()) return check(check_file, m);
  if (paper_mode) return paper(m, ranks, density);
  usage("--check FILE.csv or --paper");
}

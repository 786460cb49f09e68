// SPDX-License-Identifier: Apache-2.0
// Fashion-MNIST from its IDX files (gzip-compressed as Debian's dataset-fashion-mnist ships
// them, or plain): 28x28 grey images and labels 0..9. Read through zlib, which reads a plain
// file as it is.
#pragma once

#include <array>
#include <cstdint>
#include <cstdlib>  // getenv
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>
#include <zlib.h>

namespace fashion_mnist {

/// Where Debian's package puts the files.
inline constexpr const char* debian_directory = "/usr/share/datasets/fashion-mnist";

struct images {
  std::size_t count = 0;
  std::size_t pixels = 0;     ///< per image: 784
  std::vector<float> values;  ///< count x pixels, standardized: (x / 255 - mean) / std
  std::vector<std::uint8_t> labels;
};

struct dataset {
  images train;
  images test;
};

namespace detail {

class gz_file {
 public:
  explicit gz_file(const std::string& path) : file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) throw std::runtime_error("fashion-mnist: cannot open " + path);
  }
  gz_file(const gz_file&) = delete;
  gz_file& operator=(const gz_file&) = delete;
  ~gz_file() { gzclose(file_); }

  void read(void* out, std::size_t bytes, const std::string& path) {
    auto* p = static_cast<unsigned char*>(out);
    while (bytes > 0) {
      const unsigned piece = bytes > (1u << 30) ? (1u << 30) : static_cast<unsigned>(bytes);
      const int got = gzread(file_, p, piece);
      if (got <= 0)
        throw std::runtime_error("fashion-mnist: " + path + " ends early or is corrupt");
      p += got;
      bytes -= static_cast<std::size_t>(got);
    }
  }
  std::uint32_t big_endian_u32(const std::string& path) {
    std::array<unsigned char, 4> b{};
    read(b.data(), b.size(), path);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
           b[3];
  }

 private:
  gzFile file_;
};

/// `name` or `name.gz` in `dir`; throws naming both if neither exists.
inline std::string find_file(const std::filesystem::path& dir, const std::string& name) {
  for (const std::string& candidate : {name, name + ".gz"}) {
    if (std::filesystem::exists(dir / candidate)) return (dir / candidate).string();
  }
  throw std::runtime_error("fashion-mnist: neither " + name + " nor " + name + ".gz in " +
                           dir.string() +
                           " (install Debian's dataset-fashion-mnist package: apt-get install "
                           "dataset-fashion-mnist, or pass --data DIR)");
}

// Fashion-MNIST's training-set pixel mean and standard deviation (of x / 255).
inline constexpr float pixel_mean = 0.2860f;
inline constexpr float pixel_std = 0.3530f;

inline images read_split(const std::filesystem::path& dir, const std::string& prefix) {
  images out;
  const std::string image_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string label_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  gz_file im(image_path);
  if (im.big_endian_u32(image_path) != 0x00000803) {
    throw std::runtime_error("fashion-mnist: " + image_path +
                             " is not an IDX file of 3-D unsigned bytes");
  }
  out.count = im.big_endian_u32(image_path);
  const std::uint32_t rows = im.big_endian_u32(image_path);
  const std::uint32_t cols = im.big_endian_u32(image_path);
  if (rows != 28 || cols != 28 || out.count == 0 || out.count > 1000000) {
    throw std::runtime_error("fashion-mnist: " + image_path + " holds " +
                             std::to_string(out.count) + " images of " + std::to_string(rows) +
                             "x" + std::to_string(cols) + ", not 28x28");
  }
  out.pixels = std::size_t{rows} * cols;
  std::vector<std::uint8_t> raw(out.count * out.pixels);
  im.read(raw.data(), raw.size(), image_path);
  out.values.resize(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    out.values[i] = (static_cast<float>(raw[i]) / 255.0f - pixel_mean) / pixel_std;
  }
  gz_file lb(label_path);
  if (lb.big_endian_u32(label_path) != 0x00000801) {
    throw std::runtime_error("fashion-mnist: " + label_path +
                             " is not an IDX file of 1-D unsigned bytes");
  }
  if (lb.big_endian_u32(label_path) != out.count) {
    throw std::runtime_error("fashion-mnist: " + label_path + " and " + image_path +
                             " hold different counts");
  }
  out.labels.resize(out.count);
  lb.read(out.labels.data(), out.labels.size(), label_path);
  for (std::size_t i = 0; i < out.count; ++i) {
    if (out.labels[i] > 9)
      throw std::runtime_error("fashion-mnist: " + label_path + " has a label above 9");
  }
  return out;
}

}  // namespace detail

/// The directory: `override_dir` if not empty, else $SQUALL_FASHION_MNIST, else Debian's.
inline std::filesystem::path directory(const std::string& override_dir) {
  if (!override_dir.empty()) return override_dir;
  if (const char* env = std::getenv("SQUALL_FASHION_MNIST"); env != nullptr && *env != '\0')
    return env;
  return debian_directory;
}

/// Reads both splits from `dir`; throws `std::runtime_error` naming the missing or bad file
/// (and the Debian package when a file is missing).
inline dataset load(const std::filesystem::path& dir) {
  return {detail::read_split(dir, "train"), detail::read_split(dir, "t10k")};
}

}  // namespace fashion_mnist

// Index builders for BERT samples, packed samples and dataset blending: loops over every
// sentence (or segment) of the corpus, too slow in Python for real corpora. Compiled by
// setup.py at install time.
//
// Randomness is std::mt19937 (32-bit, seeded with one integer), whose stream equals numpy's
// RandomState(seed) raw draws, so tests can check these results against a numpy reference.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

namespace py = pybind11;
using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using Int32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using DoubleArray = py::array_t<double, py::array::c_style | py::array::forcecast>;

namespace {

// Target length of the next sample: usually max_length, but one time in `short_ratio` a
// random length in [2, max_length] so the model also sees short inputs.
int32_t target_length(std::mt19937& rng, uint32_t short_ratio, int32_t max_length) {
  if (short_ratio == 0) return max_length;
  const uint32_t draw = rng();
  if (draw % short_ratio == 0) return 2 + static_cast<int32_t>(draw % static_cast<uint32_t>(max_length - 1));
  return max_length;
}

// Rows of 4 int64 in fixed chunks: growing never copies what is there (a doubling vector holds up
// to 3x its rows while it moves them), and the result is filled chunk by chunk, each freed once
// copied, so the peak stays about the map's size plus one chunk instead of 2-3x.
class ChunkedRows {
 public:
  using Row = std::array<int64_t, 4>;
  static constexpr int64_t kChunkRows = 1 << 20;  // 32 MiB

  int64_t size() const { return size_; }
  Row& operator[](int64_t i) { return chunks_[i / kChunkRows][i % kChunkRows]; }
  void push_back(const Row& row) {
    if (size_ % kChunkRows == 0) {
      chunks_.emplace_back();
      chunks_.back().reserve(kChunkRows);
    }
    chunks_.back().push_back(row);
    ++size_;
  }
  // Moves the rows into `out` (size() rows of 4), freeing each chunk once copied.
  void move_to(int64_t* out) {
    for (auto& chunk : chunks_) {
      for (const Row& row : chunk) out = std::copy(row.begin(), row.end(), out);
      std::vector<Row>().swap(chunk);
    }
    chunks_.clear();
    size_ = 0;
  }

 private:
  std::vector<std::vector<Row>> chunks_;
  int64_t size_ = 0;
};

}  // namespace

// Samples as rows (first sentence, one past the last sentence, target length, epoch).
// A document yields consecutive sentence spans that reach the target length and hold at
// least min_num_sent sentences; its last span is kept if it has enough sentences. Documents
// with fewer than min_num_sent sentences, or with a sentence longer than long_sentence_len
// (it could not fit a sample), are skipped. Whole epochs are made until max_num_samples is
// reached or num_epochs are done, each shuffled within itself, the streams going on from one
// epoch to the next: the mapping for more samples starts with the mapping for fewer, so a run
// resumed with a longer --train-iters (or another batch size) continues the same order.
py::array_t<int64_t> build_mapping(const Int64Array& docs_array, const Int32Array& sizes_array, int64_t num_epochs,
                                   int64_t max_num_samples, int32_t max_seq_length, double short_seq_prob,
                                   uint32_t seed, int32_t min_num_sent, int32_t long_sentence_len) {
  if (docs_array.ndim() != 1 || docs_array.shape(0) < 1) throw std::invalid_argument("docs must be 1-D and non-empty");
  if (max_seq_length < 2) throw std::invalid_argument("max_seq_length must be >= 2");
  if (short_seq_prob < 0.0 || short_seq_prob > 1.0) throw std::invalid_argument("short_seq_prob must be in [0, 1]");
  const auto docs = docs_array.unchecked<1>();
  const auto sizes = sizes_array.unchecked<1>();
  const int64_t num_docs = docs.shape(0) - 1;
  for (int64_t d = 0; d <= num_docs; ++d) {
    if (docs(d) < 0 || docs(d) > sizes.shape(0) || (d > 0 && docs(d) < docs(d - 1)))
      throw std::invalid_argument("docs must be increasing sentence indices within sizes");
  }
  const uint32_t short_ratio = short_seq_prob > 0.0 ? static_cast<uint32_t>(std::lround(1.0 / short_seq_prob)) : 0;

  constexpr int64_t kCols = 4;
  ChunkedRows rows;
  {
    // Minutes on a large corpus: other Python threads (the --save lock's heartbeat) run meanwhile.
    py::gil_scoped_release released;
    std::mt19937 rng(seed);
    // Fisher-Yates with its own stream, so the order does not depend on how many targets were drawn.
    std::mt19937 shuffle_rng(seed + 1);
    for (int64_t epoch = 0; epoch < num_epochs && rows.size() < max_num_samples; ++epoch) {
      const int64_t before = rows.size();
      for (int64_t d = 0; d < num_docs; ++d) {
        const int64_t first = docs(d), last = docs(d + 1);
        if (last - first < min_num_sent) continue;
        bool too_long = false;
        for (int64_t s = first; s < last && !too_long; ++s) too_long = sizes(s) > long_sentence_len;
        if (too_long) continue;

        int32_t target = target_length(rng, short_ratio, max_seq_length);
        int64_t start = first, length = 0;
        for (int64_t s = first; s < last; ++s) {
          length += sizes(s);
          const int64_t count = s + 1 - start;
          const bool doc_ends = s + 1 == last;
          if ((length >= target && count >= min_num_sent) || doc_ends) {
            if (count >= min_num_sent) rows.push_back({start, s + 1, static_cast<int64_t>(target), epoch});
            start = s + 1;
            length = 0;
            if (!doc_ends) target = target_length(rng, short_ratio, max_seq_length);
          }
        }
      }
      if (rows.size() == before) break;  // no document yields a sample: more epochs would not either
      for (int64_t i = rows.size() - 1; i > before; --i) {
        const int64_t j = before + static_cast<int64_t>(shuffle_rng() % static_cast<uint32_t>(i - before + 1));
        std::swap(rows[i], rows[j]);
      }
    }
  }
  py::array_t<int64_t> result({rows.size(), kCols});
  rows.move_to(result.mutable_data());
  return result;
}

// Tokens of each row's sentence span: sum of sizes[first:end) for the rows (first, end, ...)
// of a build_mapping result, so packing knows every segment's length without building it.
py::array_t<int64_t> span_tokens(const Int64Array& mapping_array, const Int32Array& sizes_array) {
  if (mapping_array.ndim() != 2 || mapping_array.shape(1) < 2) throw std::invalid_argument("mapping must be [n, >= 2]");
  const auto mapping = mapping_array.unchecked<2>();
  const auto sizes = sizes_array.unchecked<1>();
  const int64_t n = mapping.shape(0);
  py::array_t<int64_t> result(n);
  auto tokens = result.mutable_unchecked<1>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t first = mapping(i, 0), end = mapping(i, 1);
    if (first < 0 || end < first || end > sizes.shape(0))
      throw std::invalid_argument("mapping rows must be spans of sizes");
    int64_t total = 0;
    for (int64_t s = first; s < end; ++s) total += sizes(s);
    tokens(i) = total;
  }
  return result;
}

// Packs segments into samples of at most `capacity` tokens (--pack-samples). The segments are
// visited in the order given (the caller passes the shuffled sample mapping); each goes to the
// open sample with the least room that still holds it (best fit), or opens a new sample. At most
// `window` samples stay open: beyond that the fullest one is closed, so the search is bounded
// and a segment lands near its place in the order. A sample with no room left closes at once;
// the ones still open at the end close in order of room. The closed samples are then shuffled
// with std::mt19937(seed) (Fisher-Yates, as build_mapping), so neighbouring samples are not
// correlated by when they filled. Returns CSR: sample i holds the segment indices
// indices[offsets[i]:offsets[i + 1]], in the order they were added; every segment is used once.
py::tuple pack_segments(const Int64Array& lengths_array, int64_t capacity, uint32_t seed, int64_t window) {
  if (lengths_array.ndim() != 1) throw std::invalid_argument("lengths must be 1-D");
  if (capacity < 1) throw std::invalid_argument("capacity must be >= 1");
  if (window < 1) throw std::invalid_argument("window must be >= 1");
  const auto lengths = lengths_array.unchecked<1>();
  const int64_t num_segments = lengths.shape(0);
  std::vector<std::vector<int64_t>> samples;  // segment indices of every sample, open or closed
  std::vector<int64_t> closed;                // sample ids in the order they closed
  std::multimap<int64_t, int64_t> open;       // room left -> sample id (equal rooms: oldest first)
  for (int64_t s = 0; s < num_segments; ++s) {
    const int64_t length = lengths(s);
    if (length < 1 || length > capacity) throw std::invalid_argument("every length must be in [1, capacity]");
    int64_t sample, room;
    const auto best = open.lower_bound(length);
    if (best != open.end()) {
      sample = best->second;
      room = best->first - length;
      open.erase(best);
    } else {
      sample = static_cast<int64_t>(samples.size());
      samples.emplace_back();
      room = capacity - length;
    }
    samples[sample].push_back(s);
    if (room == 0) {
      closed.push_back(sample);
      continue;
    }
    open.emplace(room, sample);
    if (static_cast<int64_t>(open.size()) > window) {
      closed.push_back(open.begin()->second);
      open.erase(open.begin());
    }
  }
  for (const auto& [room, sample] : open) closed.push_back(sample);

  const int64_t n = static_cast<int64_t>(closed.size());
  std::mt19937 shuffle_rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(shuffle_rng() % static_cast<uint32_t>(i + 1));
    std::swap(closed[i], closed[j]);
  }
  py::array_t<int64_t> offsets_array(n + 1);
  py::array_t<int64_t> indices_array(num_segments);
  auto offsets = offsets_array.mutable_unchecked<1>();
  auto indices = indices_array.mutable_unchecked<1>();
  offsets(0) = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (const int64_t s : samples[closed[i]]) indices(at++) = s;
    offsets(i + 1) = at;
  }
  return py::make_tuple(offsets_array, indices_array);
}

// Sample i of a blend goes to the dataset furthest behind its weighted share of i samples
// (first such dataset on ties); returns (dataset index, sample index within that dataset).
py::tuple build_blending_indices(const DoubleArray& weights_array, int64_t size) {
  const auto weights = weights_array.unchecked<1>();
  const int64_t num_datasets = weights.shape(0);
  if (num_datasets < 1) throw std::invalid_argument("weights must not be empty");
  py::array_t<int32_t> dataset_index(size);
  py::array_t<int64_t> dataset_sample_index(size);
  auto index = dataset_index.mutable_unchecked<1>();
  auto sample_index = dataset_sample_index.mutable_unchecked<1>();
  std::vector<int64_t> taken(num_datasets, 0);
  for (int64_t i = 0; i < size; ++i) {
    const double seen = std::max(static_cast<double>(i), 1.0);
    int64_t best = 0;
    double best_error = weights(0) * seen - static_cast<double>(taken[0]);
    for (int64_t d = 1; d < num_datasets; ++d) {
      const double error = weights(d) * seen - static_cast<double>(taken[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    index(i) = static_cast<int32_t>(best);
    sample_index(i) = taken[best]++;
  }
  return py::make_tuple(dataset_index, dataset_sample_index);
}

PYBIND11_MODULE(helpers, m) {
  m.doc() = "BERT sample mapping, segment packing, dataset blending indices (see megatron/data/helpers.cpp)";
  m.def("build_mapping", &build_mapping, py::arg("docs"), py::arg("sizes"), py::arg("num_epochs"),
        py::arg("max_num_samples"), py::arg("max_seq_length"), py::arg("short_seq_prob"), py::arg("seed"),
        py::arg("min_num_sent") = 2, py::arg("long_sentence_len") = 512);
  m.def("span_tokens", &span_tokens, py::arg("mapping"), py::arg("sizes"));
  m.def("pack_segments", &pack_segments, py::arg("lengths"), py::arg("capacity"), py::arg("seed"),
        py::arg("window") = 256);
  m.def("build_blending_indices", &build_blending_indices, py::arg("weights"), py::arg("size"));
}

// Index builders for BERT samples and dataset blending: loops over every sentence of the
// corpus, too slow in Python for real corpora. Compiled by setup.py at install time.
//
// Randomness is std::mt19937 (32-bit, seeded with one integer), whose stream equals numpy's
// RandomState(seed) raw draws, so tests can check these results against a numpy reference.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

}  // namespace

// Samples as rows (first sentence, one past the last sentence, target length), shuffled.
// A document yields consecutive sentence spans that reach the target length and hold at
// least min_num_sent sentences; its last span is kept if it has enough sentences. Documents
// with fewer than min_num_sent sentences, or with a sentence longer than long_sentence_len
// (it could not fit a sample), are skipped. Whole epochs are made until max_num_samples is
// reached or num_epochs are done.
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

  std::mt19937 rng(seed);
  std::vector<int64_t> rows;  // flattened [n, 3]
  for (int64_t epoch = 0; epoch < num_epochs && static_cast<int64_t>(rows.size() / 3) < max_num_samples; ++epoch) {
    const size_t before = rows.size();
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
          if (count >= min_num_sent) rows.insert(rows.end(), {start, s + 1, static_cast<int64_t>(target)});
          start = s + 1;
          length = 0;
          if (!doc_ends) target = target_length(rng, short_ratio, max_seq_length);
        }
      }
    }
    if (rows.size() == before) break;  // no document yields a sample: more epochs would not either
  }

  // Fisher-Yates with its own stream, so the order does not depend on how many targets were drawn.
  const int64_t n = static_cast<int64_t>(rows.size() / 3);
  std::mt19937 shuffle_rng(seed + 1);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(shuffle_rng() % static_cast<uint32_t>(i + 1));
    for (int k = 0; k < 3; ++k) std::swap(rows[3 * i + k], rows[3 * j + k]);
  }
  py::array_t<int64_t> result({n, static_cast<int64_t>(3)});
  std::copy(rows.begin(), rows.end(), result.mutable_data());
  return result;
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
  m.doc() = "BERT sample mapping and dataset blending indices (see megatron/data/helpers.cpp)";
  m.def("build_mapping", &build_mapping, py::arg("docs"), py::arg("sizes"), py::arg("num_epochs"),
        py::arg("max_num_samples"), py::arg("max_seq_length"), py::arg("short_seq_prob"), py::arg("seed"),
        py::arg("min_num_sent") = 2, py::arg("long_sentence_len") = 512);
  m.def("build_blending_indices", &build_blending_indices, py::arg("weights"), py::arg("size"));
}

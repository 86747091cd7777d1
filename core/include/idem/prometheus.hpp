// PrometheusWriter: text in the Prometheus exposition format (version 0.0.4), the format every
// Prometheus server, agent and node_exporter textfile collector reads.
//
//   idem::PrometheusWriter out;
//   out.family("idem_operation_calls_total", idem::PrometheusWriter::Type::counter,
//              "Calls of resilient operations by outcome.");
//   out.sample("idem_operation_calls_total", {{"operation", "charge"}, {"outcome", "executed"}},
//   3); out.family("idem_operation_call_duration_seconds", idem::PrometheusWriter::Type::histogram,
//              "How long calls took.");
//   out.histogram("idem_operation_call_duration_seconds", {{"operation", "charge"}},
//                 bounds, counts, sum_seconds);
//   std::string text = out.take();
//
// Every family starts with its # HELP and # TYPE lines; its samples follow. Label values are
// escaped (backslash, double quote, line feed), HELP text too (backslash, line feed). Values are
// written exactly (integers as integers, doubles in their shortest round-trip form, +Inf, -Inf,
// NaN). A histogram is written as cumulative _bucket{le="..."} lines ending with le="+Inf", then
// _sum and _count, with _count equal to the +Inf bucket.
//
// Bad input throws idem::InvalidArgument and writes nothing: a metric or label name outside
// [a-zA-Z_:][a-zA-Z0-9_:]* (labels: no ':', no leading "__"), a family declared twice, a sample
// of a family not declared (or not the latest one), a repeated label name, histogram bounds that
// are not increasing finite numbers, or a bucket count that does not match the bounds.
//
// Uses only the standard library; idem::Metrics (metrics.hpp) and `idem stats --format
// prometheus` write through it.
//
// Thread-safety: a writer is a plain value, used by one thread at a time.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace idem {

class PrometheusWriter {
 public:
  enum class Type { counter, gauge, histogram, untyped };
  using Label = std::pair<std::string_view, std::string_view>;

  // Starts the family `name`: its # HELP and # TYPE lines.
  void family(std::string_view name, Type type, std::string_view help);

  // One sample of the current family: `name` is the family's name (a histogram's samples go
  // through histogram()). Integers are written as integers, floating point as format_value().
  template <class T>
  requires(std::is_arithmetic_v<T> &&
           !std::is_same_v<T, bool>) void sample(std::string_view name,
                                                 std::span<const Label> labels, T value) {
    if constexpr (std::is_integral_v<T>) {
      write_sample(name, labels, std::to_string(value));
    } else {
      write_sample(name, labels, format_value(static_cast<double>(value)));
    }
  }
  template <class T>
  requires(std::is_arithmetic_v<T> &&
           !std::is_same_v<T, bool>) void sample(std::string_view name,
                                                 std::initializer_list<Label> labels, T value) {
    sample(name, std::span<const Label>(labels.begin(), labels.size()), value);
  }

  // One histogram series of the current family (of Type::histogram): `bounds` are the buckets'
  // upper bounds (increasing, finite), `counts` the observations per bucket, not cumulative:
  // counts[i] fell in (bounds[i-1], bounds[i]], and the last of bounds.size() + 1 counts above
  // every bound. `sum` is the sum of the observed values.
  void histogram(std::string_view name, std::span<const Label> labels,
                 std::span<const double> bounds, std::span<const std::uint64_t> counts, double sum);
  void histogram(std::string_view name, std::initializer_list<Label> labels,
                 std::span<const double> bounds, std::span<const std::uint64_t> counts,
                 double sum) {
    histogram(name, std::span<const Label>(labels.begin(), labels.size()), bounds, counts, sum);
  }

  // The text written so far.
  const std::string& text() const noexcept { return out_; }
  // Moves the text out; the writer starts again, empty (families may be declared again).
  std::string take();

  // Label value escaping: \ → \\, " → \", line feed → \n.
  static std::string escape_label_value(std::string_view value);
  // HELP text escaping: \ → \\, line feed → \n.
  static std::string escape_help(std::string_view help);
  static bool valid_metric_name(std::string_view name) noexcept;
  static bool valid_label_name(std::string_view name) noexcept;
  // A sample value as the format writes it: "3", "0.25", "+Inf", "NaN".
  static std::string format_value(double value);

 private:
  void write_sample(std::string_view name, std::span<const Label> labels, const std::string& value);
  void check_sample(std::string_view name, std::span<const Label> labels, bool histogram) const;
  void write_series(std::string& out, std::string_view name, std::span<const Label> labels,
                    const Label* extra) const;

  std::string out_;
  std::set<std::string, std::less<>> families_;
  std::string current_;
  Type current_type_ = Type::untyped;
};

}  // namespace idem

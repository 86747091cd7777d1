#include "idem/prometheus.hpp"

#include <charconv>
#include <cmath>
#include <limits>

#include "idem/error.hpp"

namespace idem {

namespace {

bool name_start(char c, bool colon) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}

bool name_char(char c, bool colon) noexcept {
  return name_start(c, colon) || (c >= '0' && c <= '9');
}

std::string_view type_name(PrometheusWriter::Type type) noexcept {
  switch (type) {
    case PrometheusWriter::Type::counter:
      return "counter";
    case PrometheusWriter::Type::gauge:
      return "gauge";
    case PrometheusWriter::Type::histogram:
      return "histogram";
    case PrometheusWriter::Type::untyped:
      break;
  }
  return "untyped";
}

std::string quoted(std::string_view text) {
  return "'" + std::string(text) + "'";
}

// Backslash and line feed escaped, and with `quote` the double quote too.
std::string escaped(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

bool PrometheusWriter::valid_metric_name(std::string_view name) noexcept {
  if (name.empty() || !name_start(name.front(), true)) return false;
  for (char c : name) {
    if (!name_char(c, true)) return false;
  }
  return true;
}

bool PrometheusWriter::valid_label_name(std::string_view name) noexcept {
  if (name.empty() || !name_start(name.front(), false)) return false;
  if (name.substr(0, 2) == "__") return false;  // reserved for Prometheus itself
  for (char c : name) {
    if (!name_char(c, false)) return false;
  }
  return true;
}

std::string PrometheusWriter::escape_label_value(std::string_view value) {
  return escaped(value, true);
}

std::string PrometheusWriter::escape_help(std::string_view help) {
  return escaped(help, false);
}

std::string PrometheusWriter::format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // The shortest digits that read back as `value`, laid out as Go's strconv 'g' does (the
  // Prometheus client libraries' format): an exponent from -4 to 5 in fixed notation, else
  // scientific. So a bucket's le label is the text other exporters give it: "0.0001", "60",
  // "1e+06".
  char buffer[64];
  const auto scientific =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  if (scientific.ec != std::errc()) return "NaN";  // cannot happen: 64 bytes hold any double
  const std::string_view text(buffer, static_cast<std::size_t>(scientific.ptr - buffer));
  int exponent = 0;
  const std::size_t e = text.find('e');
  static_cast<void>(std::from_chars(text.data() + e + 1 + (text[e + 1] == '+' ? 1 : 0),
                                    text.data() + text.size(), exponent));
  if (exponent < -4 || exponent >= 6) return std::string(text);
  const auto fixed = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed);
  return std::string(buffer, fixed.ptr);
}

void PrometheusWriter::family(std::string_view name, Type type, std::string_view help) {
  if (!valid_metric_name(name)) {
    throw InvalidArgument("PrometheusWriter: " + quoted(name) + " is not a valid metric name");
  }
  if (families_.count(name) > 0) {
    throw InvalidArgument("PrometheusWriter: the family " + quoted(name) +
                          " is declared twice (the format allows one block per family)");
  }
  families_.emplace(name);
  current_ = std::string(name);
  current_type_ = type;
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += escape_help(help);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type_name(type);
  out_ += '\n';
}

void PrometheusWriter::check_sample(std::string_view name, std::span<const Label> labels,
                                    bool histogram) const {
  if (current_.empty() || name != current_) {
    throw InvalidArgument(
        "PrometheusWriter: a sample of " + quoted(name) + " must follow its family() line" +
        (current_.empty() ? std::string() : " (the current family is " + quoted(current_) + ")"));
  }
  if (histogram != (current_type_ == Type::histogram)) {
    throw InvalidArgument(
        "PrometheusWriter: " + quoted(name) +
        (histogram ? " is not a histogram family" : " is a histogram: write it with histogram()"));
  }
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (!valid_label_name(labels[i].first) || (histogram && labels[i].first == "le")) {
      throw InvalidArgument("PrometheusWriter: " + quoted(labels[i].first) +
                            " is not a valid label name for " + quoted(name));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (labels[j].first == labels[i].first) {
        throw InvalidArgument("PrometheusWriter: the label " + quoted(labels[i].first) +
                              " is given twice for " + quoted(name));
      }
    }
  }
}

void PrometheusWriter::write_series(std::string& out, std::string_view name,
                                    std::span<const Label> labels, const Label* extra) const {
  out += name;
  if (labels.empty() && extra == nullptr) return;
  out += '{';
  bool first = true;
  auto add = [&](const Label& label) {
    if (!first) out += ',';
    first = false;
    out += label.first;
    out += "=\"";
    out += escape_label_value(label.second);
    out += '"';
  };
  for (const Label& label : labels)
    add(label);
  if (extra != nullptr) add(*extra);
  out += '}';
}

void PrometheusWriter::write_sample(std::string_view name, std::span<const Label> labels,
                                    const std::string& value) {
  check_sample(name, labels, false);
  write_series(out_, name, labels, nullptr);
  out_ += ' ';
  out_ += value;
  out_ += '\n';
}

void PrometheusWriter::histogram(std::string_view name, std::span<const Label> labels,
                                 std::span<const double> bounds,
                                 std::span<const std::uint64_t> counts, double sum) {
  check_sample(name, labels, true);
  if (counts.size() != bounds.size() + 1) {
    throw InvalidArgument("PrometheusWriter: histogram " + quoted(name) + " has " +
                          std::to_string(bounds.size()) + " bounds, so it needs " +
                          std::to_string(bounds.size() + 1) + " counts (got " +
                          std::to_string(counts.size()) + ")");
  }
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i - 1] < bounds[i]))) {
      throw InvalidArgument("PrometheusWriter: histogram " + quoted(name) +
                            " needs increasing finite bucket bounds");
    }
  }
  // Built aside, so that a bad call writes nothing.
  std::string text;
  const std::string bucket = std::string(name) + "_bucket";
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i <= bounds.size(); ++i) {
    cumulative += counts[i];
    const std::string le = i < bounds.size() ? format_value(bounds[i]) : std::string("+Inf");
    const Label extra{"le", le};
    write_series(text, bucket, labels, &extra);
    text += ' ';
    text += std::to_string(cumulative);
    text += '\n';
  }
  write_series(text, std::string(name) + "_sum", labels, nullptr);
  text += ' ';
  text += format_value(sum);
  text += '\n';
  write_series(text, std::string(name) + "_count", labels, nullptr);
  text += ' ';
  text += std::to_string(cumulative);
  text += '\n';
  out_ += text;
}

std::string PrometheusWriter::take() {
  std::string text = std::move(out_);
  out_.clear();
  families_.clear();
  current_.clear();
  current_type_ = Type::untyped;
  return text;
}

}  // namespace idem

#include "report_chart.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

#include "report.h"
#include "trainer/json.h"

namespace trainer::report {

constexpr double kMaxDouble = std::numeric_limits<double>::max();

std::string format_number(double v, int significant) {
  if (const char* name = json_nonfinite_name(v)) return name;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", significant, v);
  return buf;
}

std::vector<double> nice_ticks(double lo, double hi, int max_ticks, bool integer) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (lo > hi) std::swap(lo, hi);
  if (hi == lo) {
    // One value: a range around it, wider than the value itself wherever a double can say so.
    const double pad = std::max(lo == 0 ? 1.0 : std::abs(lo) * 0.1, integer ? 1.0 : 0.0);
    double a = std::max(lo - pad, -kMaxDouble), b = std::min(hi + pad, kMaxDouble);
    if (a == lo) a = std::nextafter(lo, -kMaxDouble);  // pad lost in rounding (lo tiny), or lo the lowest double
    if (b == hi) b = std::nextafter(hi, kMaxDouble);
    lo = a, hi = b;
  }
  // Here lo < hi, both finite. The two ends are the answer whenever round ticks cannot be had.
  std::vector<double> ends{lo, hi};
  max_ticks = std::clamp(max_ticks, 2, kMaxTicks);
  const double range = hi - lo;  // infinite when wider than the largest double
  const double magnitude = std::pow(10.0, std::floor(std::log10(range / max_ticks)));
  if (!std::isfinite(range) || !(magnitude > 0) || !std::isfinite(magnitude)) return ends;
  // The finest step of 1, 2 or 5 times a power of ten that needs no more than max_ticks ticks.
  double step = 0, first = 0, last = 0;
  bool found = false;
  for (const double m : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0}) {
    step = integer ? std::max(m * magnitude, 1.0) : m * magnitude;
    first = std::floor(lo / step), last = std::ceil(hi / step);
    if (first * step > lo) first -= 1;  // lo / step rounded up
    if (last * step < hi) last += 1;
    if (std::isfinite(first) && std::isfinite(last) && last - first + 1 <= max_ticks) {
      found = true;
      break;
    }
  }
  if (!found) return ends;
  // Counted with an int: `first + k` beyond 2^53 (or a step below the doubles' spacing at lo) may not
  // move, which gives equal ticks, never an endless loop.
  std::vector<double> ticks;
  for (int k = 0; k <= int(last - first); ++k) {
    const double v = (first + k) * step;
    if (!std::isfinite(v) || (!ticks.empty() && !(v > ticks.back()))) return ends;
    ticks.push_back(v == 0 ? 0.0 : v);  // not -0
  }
  if (ticks.size() < 2 || ticks.front() > lo || ticks.back() < hi) return ends;
  return ticks;
}

namespace {

/// A coordinate in the SVG: one decimal is finer than a pixel. Never "nan" (a console error in
/// browsers): values beyond a double's range (±1.8e308 both on one axis) land at the edge.
std::string coord(double v) {
  if (!std::isfinite(v)) v = 0;
  v = std::clamp(v, -1e6, 1e6);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

constexpr double kCharWidth = 7.4;     // of 12px sans text, to lay out legends and labels
constexpr std::size_t kMaxDots = 300;  // more points: no dots; and at most this many × marks a line

/// Tick labels with as many decimals as the tick spacing `step` needs, and more digits where two
/// would read the same (ticks that are not round: the two ends of a range of a few doubles).
std::vector<std::string> tick_labels(const std::vector<double>& ticks, double step) {
  double biggest = 0;
  for (const double t : ticks) biggest = std::max(biggest, std::abs(t));
  const double places = std::isfinite(step) && step > 0 ? std::ceil(-std::log10(step) - 1e-9) : 0;
  const int decimals = int(std::clamp(places, 0.0, 99.0));
  std::vector<std::string> labels;
  for (int digits = 3; digits <= 17; ++digits) {
    labels.clear();
    char buf[64];
    for (const double t : ticks) {
      if (decimals > 6 || biggest >= 1e7 || digits > 3) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, t);
      } else {
        std::snprintf(buf, sizeof buf, "%.*f", decimals, t);
      }
      labels.emplace_back(buf);
    }
    if (std::adjacent_find(labels.begin(), labels.end()) == labels.end()) break;
  }
  return labels;
}

/// Where `v` lies from `lo` (0) to `hi` (1), also when hi - lo is wider than the largest double.
double fraction(double v, double lo, double hi) {
  if (std::isfinite(hi - lo)) return (v - lo) / (hi - lo);
  return (v / 2 - lo / 2) / (hi / 2 - lo / 2);
}

/// Appends the points of `pts` at `index` (four indices, in any order, some equal) in order, once each.
void keep_in_order(const std::vector<XY>& pts, std::array<std::size_t, 4> index, std::vector<XY>& out) {
  std::sort(index.begin(), index.end());
  for (std::size_t k = 0; k < index.size(); ++k) {
    if (k == 0 || index[k] != index[k - 1]) out.push_back(pts[index[k]]);
  }
}

/// Keeps the first, lowest, highest and last point of each run of points that fall in one pixel
/// column: the drawn line looks the same with a fraction of the points.
std::vector<XY> thin_out(const std::vector<XY>& pts, double x0, double px_per_x) {
  std::vector<XY> out;
  std::size_t i = 0;
  while (i < pts.size()) {
    const long column = std::lround((pts[i].x - x0) * px_per_x);
    std::size_t j = i, lo = i, hi = i;
    while (j < pts.size() && std::lround((pts[j].x - x0) * px_per_x) == column) {
      if (pts[j].y < pts[lo].y) lo = j;
      if (pts[j].y > pts[hi].y) hi = j;
      ++j;
    }
    keep_in_order(pts, {i, lo, hi, j - 1}, out);
    i = j;
  }
  return out;
}

/// At most kMaxLinePoints of `pts`: the first, lowest, highest and last point of each of
/// kMaxLinePoints / 4 runs of consecutive points, in order. A spike or a dip stays drawn, whatever
/// the order of x (a run resumed from an earlier step goes back).
std::vector<XY> downsample(const std::vector<XY>& pts) {
  if (pts.size() <= kMaxLinePoints) return pts;
  const std::size_t buckets = kMaxLinePoints / 4, n = pts.size();
  std::vector<XY> out;
  out.reserve(kMaxLinePoints);
  for (std::size_t b = 0; b < buckets; ++b) {
    const std::size_t begin = b * n / buckets, end = (b + 1) * n / buckets;
    if (begin == end) continue;
    std::size_t lo = begin, hi = begin;
    for (std::size_t k = begin; k < end; ++k) {
      if (pts[k].y < pts[lo].y) lo = k;
      if (pts[k].y > pts[hi].y) hi = k;
    }
    keep_in_order(pts, {begin, lo, hi, end - 1}, out);
  }
  return out;
}

/// `lines` stacked: each line's y is its own plus those of the lines before it.
std::vector<Line> stack(const std::vector<Line>& lines) {
  std::vector<Line> out = lines;
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (std::size_t k = 0; k < out[i].points.size(); ++k) {
      double& y = out[i].points[k].y;
      if (!std::isfinite(y)) y = 0;
      if (i > 0 && k < out[i - 1].points.size()) y += out[i - 1].points[k].y;
    }
  }
  return out;
}

/// The indices a stacked chart draws: all of them, or at most kMaxLinePoints: of each run of
/// consecutive points, the first, the highest (of the whole stack) and the last.
std::vector<std::size_t> stacked_indices(const std::vector<XY>& top) {
  std::vector<std::size_t> out;
  const std::size_t n = top.size();
  if (n <= kMaxLinePoints) {
    for (std::size_t k = 0; k < n; ++k) out.push_back(k);
    return out;
  }
  const std::size_t buckets = kMaxLinePoints / 3;
  for (std::size_t b = 0; b < buckets; ++b) {
    const std::size_t begin = b * n / buckets, end = (b + 1) * n / buckets;
    if (begin == end) continue;
    std::size_t hi = begin;
    for (std::size_t k = begin; k < end; ++k) {
      if (top[k].y > top[hi].y) hi = k;
    }
    for (const std::size_t k : {begin, hi, end - 1}) {
      if (out.empty() || out.back() < k) out.push_back(k);
    }
  }
  return out;
}

}  // namespace

std::string render_svg(const Chart& chart) {
  // A stacked chart is drawn from its running sums; its legend names the lines as given.
  Chart stacked_copy;
  if (chart.stacked) {
    stacked_copy = chart;
    stacked_copy.lines = stack(chart.lines);
  }
  const Chart& c = chart.stacked ? stacked_copy : chart;
  // Legend: rows of swatches above the plot, wrapped to the chart's width.
  struct Item {
    std::string text, colour, dash;
    bool marker;
    double x;
    int row;
  };
  std::vector<Item> items;
  for (const auto& l : c.lines) {
    std::size_t bad = 0;
    for (const auto& p : l.points) bad += !std::isfinite(p.y);
    items.push_back({bad ? l.label + " (" + std::to_string(bad) + " NaN/inf not drawn)" : l.label, l.colour,
                     l.dashed ? "7 4" : "", false, 0, 0});
  }
  std::set<std::string> marker_kinds;
  for (const auto& m : c.markers) {
    if (marker_kinds.insert(m.kind).second) items.push_back({m.kind, m.colour, "5 3", true, 0, 0});
  }
  const double left = 70, right = 18, bottom = 44;
  double x = left;
  int row = 0;
  for (auto& it : items) {
    const double w = 26 + it.text.size() * kCharWidth + 18;
    if (x + w > c.width - right && x > left) {
      x = left;
      ++row;
    }
    it.x = x;
    it.row = row;
    x += w;
  }
  const double top = 14 + (items.empty() ? 0 : (row + 1) * 18);
  const double pw = c.width - left - right, ph = c.height - top - bottom;

  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const auto& l : c.lines) {
    for (const auto& p : l.points) {
      if (!std::isfinite(p.x)) continue;
      xmin = std::min(xmin, p.x);
      xmax = std::max(xmax, p.x);
      if (!std::isfinite(p.y)) continue;
      ymin = std::min(ymin, p.y);
      ymax = std::max(ymax, p.y);
    }
  }
  for (const auto& m : c.markers) {
    if (!std::isfinite(m.x)) continue;
    xmin = std::min(xmin, m.x);
    xmax = std::max(xmax, m.x);
  }
  if (!(xmin <= xmax)) xmin = 0, xmax = 1;
  if (!(ymin <= ymax)) ymin = 0, ymax = 1;
  if (c.stacked) ymin = std::min(ymin, 0.0);  // areas rise from 0
  // The x axis spans the data (from 0 when the data starts near it), the y axis round values.
  if (xmin > 0 && xmin < 0.2 * xmax && !c.x_log10) xmin = 0;
  double x0 = xmin, x1 = xmax;
  std::vector<double> xt = nice_ticks(xmin, xmax, std::max(3, int(pw / 80)), c.x_is_step || c.x_log10);
  const double x_step = xt[1] - xt[0];
  if (x1 > x0) {
    const double pad = x1 * 0.015 - x0 * 0.015;  // finite where x1 - x0 is not
    x0 = std::max(x0 - pad, -kMaxDouble), x1 = std::min(x1 + pad, kMaxDouble);
    xt.erase(std::remove_if(xt.begin(), xt.end(), [&](double t) { return t < x0 || t > x1; }), xt.end());
    if (c.x_log10 && xt.size() < 2) {
      // Less than a decade: powers of ten between the ends are too few, so round exponents are not.
      xt = nice_ticks(xmin, xmax, std::max(3, int(pw / 80)), false);
      xt.erase(std::remove_if(xt.begin(), xt.end(), [&](double t) { return t < x0 || t > x1; }), xt.end());
    }
  } else {
    x0 = xt.front(), x1 = xt.back();
  }
  const auto yt = nice_ticks(ymin, ymax, std::max(3, int(ph / 40)));
  const double y0 = yt.front(), y1 = yt.back();
  auto px = [&](double v) { return left + fraction(v, x0, x1) * pw; };
  auto py = [&](double v) { return top + ph - fraction(v, y0, y1) * ph; };

  std::ostringstream s;
  s << "<svg viewBox=\"0 0 " << c.width << ' ' << c.height << "\" role=\"img\" aria-label=\"" << html_escape(c.title)
    << "\">\n";
  s << "<rect class=\"plot\" x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
    << "\"/>\n";
  auto xl = tick_labels(xt, x_step);
  const auto yl = tick_labels(yt, yt[1] - yt[0]);
  if (c.x_log10) {
    for (std::size_t i = 0; i < xt.size(); ++i) xl[i] = format_number(std::pow(10.0, xt[i]), 3);
  }
  for (std::size_t i = 0; i < yt.size(); ++i) {
    const std::string y = coord(py(yt[i]));
    s << "<line class=\"grid\" x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + pw << "\" y2=\"" << y
      << "\"/><text class=\"tick\" x=\"" << left - 6 << "\" y=\"" << y << "\" dy=\"0.32em\" text-anchor=\"end\">"
      << yl[i] << "</text>\n";
  }
  for (std::size_t i = 0; i < xt.size(); ++i) {
    const std::string xs = coord(px(xt[i]));
    s << "<line class=\"grid\" x1=\"" << xs << "\" y1=\"" << top << "\" x2=\"" << xs << "\" y2=\"" << top + ph
      << "\"/><text class=\"tick\" x=\"" << xs << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\">" << xl[i]
      << "</text>\n";
  }
  s << "<path class=\"axis\" d=\"M" << left << ' ' << top << "V" << top + ph << "H" << left + pw << "\"/>\n";
  s << "<text class=\"label\" x=\"" << left + pw / 2 << "\" y=\"" << c.height - 6 << "\" text-anchor=\"middle\">"
    << html_escape(c.x_label) << "</text>\n";
  if (!c.y_label.empty()) {
    s << "<text class=\"label\" transform=\"translate(14 " << coord(top + ph / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">" << html_escape(c.y_label) << "</text>\n";
  }

  const bool areas = c.stacked && !c.lines.empty() && std::all_of(c.lines.begin(), c.lines.end(), [&](const Line& l) {
                       return l.points.size() == c.lines.front().points.size();
                     });
  if (areas) {
    // An area per line, between its running sum and the one below, under a tooltip of its name.
    const std::vector<std::size_t> drawn = stacked_indices(c.lines.back().points);
    for (std::size_t i = 0; i < c.lines.size(); ++i) {
      const auto& l = c.lines[i];
      s << "<polygon fill=\"" << l.colour << "\" fill-opacity=\"0.85\" stroke=\"" << l.colour
        << "\" stroke-width=\"0.5\" points=\"";
      for (const std::size_t k : drawn) s << coord(px(l.points[k].x)) << ',' << coord(py(l.points[k].y)) << ' ';
      for (auto k = drawn.rbegin(); k != drawn.rend(); ++k) {
        const double below = i > 0 ? c.lines[i - 1].points[*k].y : 0.0;
        s << coord(px(l.points[*k].x)) << ',' << coord(py(below)) << ' ';
      }
      s << "\"><title>" << html_escape(l.label) << "</title></polygon>\n";
    }
    // Over them, columns (at most kMaxDots, evenly spread over the drawn points) whose tooltips
    // give every line's own value at that step.
    const auto& sum = c.lines.back().points;
    std::vector<std::size_t> cols;
    const std::size_t stride = (drawn.size() + kMaxDots - 1) / kMaxDots;
    for (std::size_t d = 0; d < drawn.size(); d += std::max<std::size_t>(stride, 1)) cols.push_back(drawn[d]);
    for (std::size_t d = 0; d < cols.size(); ++d) {
      const std::size_t k = cols[d];
      const double from = px(d == 0 ? sum[k].x : (sum[cols[d - 1]].x + sum[k].x) / 2);
      const double to = px(d + 1 == cols.size() ? sum[k].x : (sum[k].x + sum[cols[d + 1]].x) / 2);
      std::string tip = "step " + format_number(sum[k].step, 12);
      for (auto l = chart.lines.rbegin(); l != chart.lines.rend(); ++l) {
        if (k < l->points.size()) tip += "\n" + l->label + ": " + format_number(l->points[k].y, 4);
      }
      s << "<rect class=\"column\" x=\"" << coord(from) << "\" y=\"" << top << "\" width=\""
        << coord(std::max(to - from, 1.0)) << "\" height=\"" << ph << "\" fill=\"transparent\"><title>"
        << html_escape(tip) << "</title></rect>\n";
    }
  }
  for (const auto& l : c.lines) {
    if (c.stacked) break;
    std::vector<XY> finite;
    std::vector<const XY*> bad;
    for (const auto& p : l.points) {
      if (!std::isfinite(p.x)) continue;
      if (std::isfinite(p.y)) {
        finite.push_back(p);
      } else if (bad.size() < kMaxDots) {
        bad.push_back(&p);
      }
    }
    const std::vector<XY> drawn = downsample(finite.size() > 4 * pw ? thin_out(finite, x0, pw / (x1 - x0)) : finite);
    if (drawn.size() > 1) {
      s << "<polyline fill=\"none\" stroke=\"" << l.colour << "\" stroke-width=\"1.8\" stroke-linejoin=\"round\""
        << (l.dashed ? " stroke-dasharray=\"7 4\"" : "") << " points=\"";
      for (const auto& p : drawn) s << coord(px(p.x)) << ',' << coord(py(p.y)) << ' ';
      s << "\"/>\n";
    }
    auto tip = [&](const XY& p) {
      std::string t = l.label + ": " + format_number(p.y) + " at ";
      if (c.x_is_step) return t + "step " + format_number(p.step, 12);
      const double x = c.x_log10 ? std::pow(10.0, p.x) : p.x;
      return t + format_number(x, 4) + " " + c.x_label + " (step " + format_number(p.step, 12) + ")";
    };
    if (finite.size() <= kMaxDots) {
      for (const auto& p : finite) {
        s << "<circle cx=\"" << coord(px(p.x)) << "\" cy=\"" << coord(py(p.y)) << "\" r=\"2.6\" fill=\"" << l.colour
          << "\"><title>" << html_escape(tip(p)) << "</title></circle>\n";
      }
    }
    for (const XY* p : bad) {
      const double bx = px(p->x), by = top + ph - 6;
      s << "<path class=\"nonfinite\" d=\"M" << coord(bx - 4) << ' ' << coord(by - 4) << "l8 8m0 -8l-8 8\"><title>"
        << html_escape(tip(*p)) << " (not drawn)</title></path>\n";
    }
  }
  // Markers over the lines: a label must stay readable on a dense line (it has a white halo).
  for (std::size_t i = 0; i < c.markers.size(); ++i) {
    const auto& m = c.markers[i];
    if (!std::isfinite(m.x)) continue;
    const double mx = px(m.x);
    const bool flip = mx > left + pw * 0.7;
    s << "<g class=\"marker\"><title>" << html_escape(m.tip) << "</title><line x1=\"" << coord(mx) << "\" y1=\"" << top
      << "\" x2=\"" << coord(mx) << "\" y2=\"" << top + ph << "\" stroke=\"" << m.colour
      << "\" stroke-dasharray=\"5 3\" stroke-width=\"1.5\"/><text class=\"mlabel\" x=\"" << coord(mx + (flip ? -4 : 4))
      << "\" y=\"" << coord(top + 13 + (i % 4) * 14) << "\" fill=\"" << m.colour << "\" text-anchor=\""
      << (flip ? "end" : "start") << "\">" << html_escape(m.label) << "</text></g>\n";
  }
  for (const auto& it : items) {
    const double ly = 14 + it.row * 18;
    s << "<line x1=\"" << it.x << "\" y1=\"" << ly << "\" x2=\"" << it.x + 20 << "\" y2=\"" << ly << "\" stroke=\""
      << it.colour << "\" stroke-width=\"" << (it.marker ? 2 : 3) << "\""
      << (it.dash.empty() ? "" : " stroke-dasharray=\"" + it.dash + "\"") << "/>";
    s << "<text class=\"legend\" x=\"" << it.x + 26 << "\" y=\"" << ly << "\" dy=\"0.32em\">" << html_escape(it.text)
      << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace trainer::report

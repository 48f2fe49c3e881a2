#include "report_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

#include "report.h"

namespace trainer::report {

std::string format_number(double v, int significant) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", significant, v);
  return buf;
}

std::vector<double> nice_ticks(double lo, double hi, int max_ticks, bool integer) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (lo > hi) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = std::max(lo == 0 ? 1.0 : std::abs(lo) * 0.1, integer ? 1.0 : 0.0);
    lo -= pad;
    hi += pad;
  }
  if (!std::isfinite(hi - lo)) return {lo, hi};
  max_ticks = std::max(max_ticks, 2);
  // The finest step of 1, 2 or 5 times a power of ten that needs no more than max_ticks ticks.
  const double magnitude = std::pow(10.0, std::floor(std::log10((hi - lo) / max_ticks)));
  double step = magnitude;
  for (const double m : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0}) {
    step = m * magnitude;
    if (integer) step = std::max(step, 1.0);
    if (std::ceil(hi / step) - std::floor(lo / step) + 1 <= max_ticks) break;
  }
  const double first = std::floor(lo / step), last = std::ceil(hi / step);
  std::vector<double> ticks;
  for (double i = first; i <= last + 1e-9; i += 1) {
    const double v = i * step;
    ticks.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  if (ticks.size() < 2) ticks.push_back(ticks.back() + step);
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

/// Tick labels with as many decimals as the tick spacing `step` needs.
std::vector<std::string> tick_labels(const std::vector<double>& ticks, double step) {
  double biggest = 0;
  for (const double t : ticks) biggest = std::max(biggest, std::abs(t));
  const int decimals = std::max(0, int(std::ceil(-std::log10(step) - 1e-9)));
  std::vector<std::string> labels;
  char buf[64];
  for (const double t : ticks) {
    if (decimals > 6 || biggest >= 1e7) {
      std::snprintf(buf, sizeof buf, "%.3g", t);
    } else {
      std::snprintf(buf, sizeof buf, "%.*f", decimals, t);
    }
    labels.push_back(buf);
  }
  return labels;
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
    std::set<std::size_t> keep{i, lo, hi, j - 1};
    for (const auto k : keep) out.push_back(pts[k]);
    i = j;
  }
  return out;
}

}  // namespace

std::string render_svg(const Chart& c) {
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
    xmin = std::min(xmin, m.x);
    xmax = std::max(xmax, m.x);
  }
  if (!(xmin <= xmax)) xmin = 0, xmax = 1;
  if (!(ymin <= ymax)) ymin = 0, ymax = 1;
  // The x axis spans the data (from 0 when the data starts near it), the y axis round values.
  if (xmin > 0 && xmin < 0.2 * xmax) xmin = 0;
  double x0 = xmin, x1 = xmax;
  std::vector<double> xt = nice_ticks(xmin, xmax, std::max(3, int(pw / 80)), c.x_is_step);
  const double x_step = xt[1] - xt[0];
  if (x1 > x0) {
    const double pad = (x1 - x0) * 0.015;
    x0 -= pad, x1 += pad;
    xt.erase(std::remove_if(xt.begin(), xt.end(), [&](double t) { return t < x0 || t > x1; }), xt.end());
  } else {
    x0 = xt.front(), x1 = xt.back();
  }
  const auto yt = nice_ticks(ymin, ymax, std::max(3, int(ph / 40)));
  const double y0 = yt.front(), y1 = yt.back();
  auto px = [&](double v) { return left + (v - x0) / (x1 - x0) * pw; };
  auto py = [&](double v) { return top + ph - (v - y0) / (y1 - y0) * ph; };

  std::ostringstream s;
  s << "<svg viewBox=\"0 0 " << c.width << ' ' << c.height << "\" role=\"img\" aria-label=\"" << html_escape(c.title)
    << "\">\n";
  s << "<rect class=\"plot\" x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
    << "\"/>\n";
  const auto xl = tick_labels(xt, x_step), yl = tick_labels(yt, yt[1] - yt[0]);
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

  for (const auto& l : c.lines) {
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
    const std::vector<XY> drawn = finite.size() > 4 * pw ? thin_out(finite, x0, pw / (x1 - x0)) : finite;
    if (drawn.size() > 1) {
      s << "<polyline fill=\"none\" stroke=\"" << l.colour << "\" stroke-width=\"1.8\" stroke-linejoin=\"round\""
        << (l.dashed ? " stroke-dasharray=\"7 4\"" : "") << " points=\"";
      for (const auto& p : drawn) s << coord(px(p.x)) << ',' << coord(py(p.y)) << ' ';
      s << "\"/>\n";
    }
    auto tip = [&](const XY& p) {
      std::string t = l.label + ": " + format_number(p.y) + " at ";
      if (c.x_is_step) return t + "step " + format_number(p.step, 12);
      return t + format_number(p.x, 4) + " " + c.x_label + " (step " + format_number(p.step, 12) + ")";
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

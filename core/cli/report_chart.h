#pragma once
// The report's line charts, drawn as inline SVG (private to `trainer report`).

#include <string>
#include <vector>

namespace trainer::report {

/// A point of a chart; `step` names it in the tooltip when x is not the step.
struct XY {
  double x = 0;
  double y = 0;  ///< NaN or ±infinity: not drawn, marked × on the x axis
  double step = 0;
};

/// One series, drawn in file order (a polyline through the finite points, a dot with a tooltip each).
struct Line {
  std::string label;
  std::string colour;  ///< a CSS colour
  std::vector<XY> points;
  bool dashed = false;  ///< so that a line lying on another one stays visible
};

/// A vertical line at `x` with a label at the top of the plot (an event: an out-of-memory error).
struct Marker {
  double x = 0;
  std::string label;  ///< drawn beside the line
  std::string tip;    ///< its tooltip
  std::string colour;
  std::string kind;  ///< its legend entry, one per kind
};

/// A chart: its size is the SVG's viewBox (it scales to the width of its container).
struct Chart {
  std::string title;
  std::string x_label;
  std::string y_label;    ///< empty: none
  bool x_is_step = true;  ///< integer x ticks; else x is time and tooltips also name the step
  int width = 600;
  int height = 300;
  std::vector<Line> lines;
  std::vector<Marker> markers;
  /// x holds log10 of the value (a learning rate): tick labels and tooltips show the value.
  bool x_log10 = false;
  /// The lines are stacked areas, each on top of the ones before it: every line has the same
  /// x values in the same order (a y that is not finite counts as 0).
  bool stacked = false;
};

/// The chart as an `<svg>` element: plot area, grid, axes with tick labels, axis labels, legend,
/// lines, dots with `<title>` tooltips, markers. Lines of many points are thinned to the pixel.
std::string render_svg(const Chart& chart);

/// `v` with `significant` digits ("%g"); "NaN", "Infinity", "-Infinity" for the others.
std::string format_number(double v, int significant = 6);

}  // namespace trainer::report

// `trainer report` on hostile or absurd run directories: the axis ticks, the page and every file read stay
// bounded. Code that could hang or allocate without bound runs in a child process with a time and memory
// limit, so that a regression fails the test instead of hanging it or exhausting the machine.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "report.h"
#include "support/bounded_child.h"

namespace {

namespace fs = std::filesystem;
namespace rp = trainer::report;

constexpr double kMax = std::numeric_limits<double>::max();
constexpr double kDenormMin = std::numeric_limits<double>::denorm_min();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kT0 = 1795533884.0;
constexpr std::uintmax_t kGiB = 1ull << 30;

/// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "test";
    path_ = fs::temp_directory_path() / ("trainer_report_bounds_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& rel) const { return (path_ / rel).string(); }

 private:
  fs::path path_;
};

void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

/// `head`, then holes (read as zero bytes) up to `size` bytes, then `tail`: a huge file that takes no disk.
void write_sparse(const std::string& path, const std::string& head, std::uintmax_t size, const std::string& tail = "") {
  write_file(path, head);
  fs::resize_file(path, size);
  std::ofstream(path, std::ios::binary | std::ios::app) << tail;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

using trainer::testing::BoundedChild;
using trainer::testing::run_bounded;

/// Expects the child to have ended normally with nothing to report.
#define EXPECT_HELD(child)                                                                                       \
  do {                                                                                                           \
    const BoundedChild c_ = (child);                                                                             \
    EXPECT_EQ(c_.code, 0) << (c_.code == 128 + SIGALRM ? "it did not end (killed by the time limit)" : c_.text); \
    EXPECT_EQ(c_.text, "");                                                                                      \
  } while (0)

/// What is wrong with `ticks` for [lo, hi] (empty: nothing): at least two, at most `max_ticks`, finite,
/// increasing, covering the range.
std::string tick_problems(const std::vector<double>& ticks, double lo, double hi, int max_ticks) {
  std::ostringstream p;
  p.precision(17);
  if (ticks.size() < 2 || ticks.size() > std::size_t(std::max(max_ticks, 2))) p << ticks.size() << " ticks; ";
  for (std::size_t i = 0; i < ticks.size(); ++i) {
    if (!std::isfinite(ticks[i])) p << "tick " << i << " is " << ticks[i] << "; ";
    if (i > 0 && !(ticks[i] > ticks[i - 1])) p << "tick " << i << " is not above the one before; ";
  }
  if (!ticks.empty() && std::isfinite(lo) && std::isfinite(hi)) {
    if (ticks.front() > std::min(lo, hi)) p << "first tick " << ticks.front() << " above " << lo << "; ";
    if (ticks.back() < std::max(lo, hi)) p << "last tick " << ticks.back() << " below " << hi << "; ";
  }
  return p.str();
}

struct Range {
  const char* what;
  double lo, hi;
};

const std::vector<Range>& awkward_ranges() {
  static const std::vector<Range> ranges = {
      {"1e17 and the next double", 1e17, 1.0000000000000002e17},
      {"a range of 1e-300", 1e-300, 2e-300},
      {"from 0 to 1e-300", 0, 1e-300},
      {"1 and 1 + 1e-300 (one double)", 1, 1 + 1e-300},
      {"-1 and the next double", -1, std::nextafter(-1.0, 0.0)},
      {"a single point at the smallest double", kDenormMin, kDenormMin},
      {"around 0 by the smallest doubles", -kDenormMin, kDenormMin},
      {"a single point at the largest double", kMax, kMax},
      {"a single point at the lowest double", -kMax, -kMax},
      {"from 0 to the largest double", 0, kMax},
      {"the whole double range", -kMax, kMax},
      {"4.5e15 and the next double", 4.5e15, std::nextafter(4.5e15, kInf)},
      {"9.007199254740993e15, past 2^53", 9007199254740992.0, 9007199254740996.0},
      {"1e300 and the next double", 1e300, std::nextafter(1e300, kInf)},
      {"a single point", 3.25, 3.25},
      {"reversed", 10, -10},
  };
  return ranges;
}

TEST(NiceTicksBounds, AwkwardFiniteRangesGiveFewIncreasingFiniteTicksCoveringThem) {
  for (const bool integer : {false, true}) {
    EXPECT_HELD(run_bounded([integer] {
      std::string problems;
      for (const auto& r : awkward_ranges()) {
        for (const int max_ticks : {2, 6, 14}) {
          const std::string p = tick_problems(rp::nice_ticks(r.lo, r.hi, max_ticks, integer), r.lo, r.hi, max_ticks);
          if (!p.empty()) {
            problems += std::string(r.what) + " (max " + std::to_string(max_ticks) + (integer ? ", integer" : "") +
                        "): " + p + "\n";
          }
        }
      }
      return problems;
    }));
  }
}

TEST(NiceTicksBounds, NeighbouringHugeValuesFallBackToTheirTwoEnds) {
  EXPECT_HELD(run_bounded([] {
    const auto ticks = rp::nice_ticks(1e17, 1.0000000000000002e17, 6);
    return ticks == std::vector<double>{1e17, 1.0000000000000002e17} ? "" : "not the two end values";
  }));
}

TEST(NiceTicksBounds, NaNAndInfinityGiveTwoFiniteTicks) {
  for (const double bad : {kNaN, kInf, -kInf}) {
    for (const auto& t : {rp::nice_ticks(bad, 1, 6), rp::nice_ticks(0, bad, 6), rp::nice_ticks(bad, bad, 6)}) {
      EXPECT_EQ(tick_problems(t, kNaN, kNaN, 6), "") << bad;
    }
  }
}

TEST(NiceTicksBounds, AskingForAnAbsurdNumberOfTicksGivesFewOfThem) {
  EXPECT_LE(rp::nice_ticks(0, 1e6, 1000000).size(), std::size_t(rp::kMaxTicks));
  EXPECT_EQ(tick_problems(rp::nice_ticks(0, 1, -5), 0, 1, 2), "");
}

// ---- The page ------------------------------------------------------------------------------

/// The `<svg>` elements of the page whose figure is titled `title`.
std::string chart(const std::string& html, const std::string& title) {
  const std::size_t at = html.find("<h3>" + title + "</h3>");
  if (at == std::string::npos) return "";
  const std::size_t begin = html.find("<svg ", at), end = html.find("</svg>", begin);
  return begin == std::string::npos || end == std::string::npos ? "" : html.substr(begin, end - begin);
}

std::string attribute(const std::string& text, std::size_t at, const std::string& name) {
  at = text.find(" " + name + "=\"", at);
  if (at == std::string::npos) return "";
  const std::size_t begin = at + name.size() + 3;
  return text.substr(begin, text.find('"', begin) - begin);
}

/// The (x, y) pairs of every polyline of `svg`, one vector per polyline.
std::vector<std::vector<std::pair<double, double>>> polylines(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> lines;
  for (std::size_t at = svg.find("<polyline "); at != std::string::npos; at = svg.find("<polyline ", at + 1)) {
    std::istringstream pairs(attribute(svg, at, "points"));
    lines.emplace_back();
    double x, y;
    char comma;
    while (pairs >> x >> comma >> y) lines.back().emplace_back(x, y);
  }
  return lines;
}

/// The tick labels of `svg`, in order.
std::vector<std::string> tick_labels(const std::string& svg) {
  std::vector<std::string> labels;
  for (std::size_t at = svg.find("class=\"tick\""); at != std::string::npos; at = svg.find("class=\"tick\"", at + 1)) {
    const std::size_t begin = svg.find('>', at) + 1;
    labels.push_back(svg.substr(begin, svg.find('<', begin) - begin));
  }
  return labels;
}

rp::RunData run_named(const std::string& name) {
  rp::RunData d;
  d.dir = "/runs/" + name;
  d.name = name;
  d.generated_at = kT0 + 1000;
  return d;
}

void add(rp::RunData& d, const std::string& name, double step, double value, double time = kNaN) {
  d.metrics[name].push_back({step, value, time});
  ++d.lines_read;
}

/// A loss of a million points near 1, with one spike to 1000 and one dip to -1000.
rp::RunData million_points(bool shuffled) {
  rp::RunData d = run_named("million");
  std::vector<double> steps(1000000);
  for (std::size_t i = 0; i < steps.size(); ++i) steps[i] = double(i);
  if (shuffled) std::shuffle(steps.begin(), steps.end(), std::mt19937(7));
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> noise(0.9, 1.1);
  auto& loss = d.metrics["train/loss"];
  loss.reserve(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    loss.push_back({steps[i], i == 123457 ? 1000 : i == 765433 ? -1000 : noise(gen), kNaN});
  }
  d.lines_read = loss.size();
  return d;
}

/// Problems of the Loss chart of a million points: too many points drawn, the spike or dip lost, a big page.
std::string million_point_problems(const std::string& html) {
  std::ostringstream p;
  if (html.size() > (2u << 20)) p << "page of " << html.size() << " bytes; ";
  const std::string svg = chart(html, "Loss");
  const auto lines = polylines(svg);
  if (lines.size() != 1) return p.str() + std::to_string(lines.size()) + " polylines in the Loss chart";
  if (lines[0].size() > rp::kMaxLinePoints) p << lines[0].size() << " points drawn; ";
  const std::size_t plot = svg.find("class=\"plot\"");
  const double top = std::stod(attribute(svg, plot, "y")), bottom = top + std::stod(attribute(svg, plot, "height"));
  double high = bottom, low = top;
  for (const auto& [x, y] : lines[0]) high = std::min(high, y), low = std::max(low, y);
  if (high > top + 1)
    p << "the spike to 1000 is not drawn (highest point at y " << high << ", plot from " << top << "); ";
  if (low < bottom - 1)
    p << "the dip to -1000 is not drawn (lowest point at y " << low << ", plot to " << bottom << "); ";
  return p.str();
}

TEST(ReportBounds, AMillionPointSeriesIsDrawnWithAtMostTheCapOfPointsKeepingItsSpikes) {
  EXPECT_HELD(run_bounded([] { return million_point_problems(rp::render_html(million_points(false))); }));
}

TEST(ReportBounds, AMillionPointsInNoOrderStillMakeASmallPage) {
  EXPECT_HELD(run_bounded([] { return million_point_problems(rp::render_html(million_points(true))); }));
}

TEST(ReportBounds, ThousandsOfMetricNamesDrawAtMostTheCapOfChartsAndSaySo) {
  rp::RunData d = run_named("names");
  for (int i = 0; i < 5000; ++i) add(d, "custom/metric_" + std::to_string(10000 + i), 1, i);
  const std::string html = rp::render_html(d);
  EXPECT_LE(count(html, "<svg "), rp::kMaxOtherCharts);
  EXPECT_TRUE(contains(html, "5000 other metrics: the first " + std::to_string(rp::kMaxOtherCharts) + " drawn"));
  EXPECT_LT(html.size(), 4u << 20);
}

TEST(ReportBounds, ThousandsOfOutOfMemoryErrorsMarkAtMostTheCapAndSaySo) {
  rp::RunData d = run_named("ooms");
  for (int i = 0; i < 100000; ++i) {
    add(d, "oom/micro_batch_size", i, 32, kT0 + i);
    add(d, "memory/allocated_mb", i, 100 + i % 7, kT0 + i);
  }
  const std::string html = rp::render_html(d);
  EXPECT_LE(count(html, "<g class=\"marker\">"), rp::kMaxMarkers);
  EXPECT_TRUE(contains(html, "100000 out-of-memory errors and micro-batch changes: the first " +
                                 std::to_string(rp::kMaxMarkers) + " marked"));
  EXPECT_LT(html.size(), 2u << 20);
}

TEST(ReportBounds, ValuesAtTheEdgesOfTheDoubleRangeAreDrawnWithDistinctTickLabels) {
  EXPECT_HELD(run_bounded([] {
    rp::RunData d = run_named("edges");
    for (int i = 0; i < 10; ++i) add(d, "train/loss", i, i % 2 ? 1e17 : 1.0000000000000002e17);
    for (int i = 0; i < 10; ++i) add(d, "train/accuracy", i, i % 2 ? 1e-300 : 2e-300);
    add(d, "train/lr", 0, kDenormMin);  // one point, at the smallest double
    add(d, "train/samples_per_s", -kMax, -kMax);
    add(d, "train/samples_per_s", kMax, kMax);
    for (int i = 0; i < 5; ++i) add(d, "custom/nonfinite", i, i == 0 ? kNaN : i == 1 ? kInf : i == 2 ? -kInf : 1);
    add(d, "custom/huge_steps", 1e300, 1);
    add(d, "custom/huge_steps", std::nextafter(1e300, kInf), 2);
    const std::string html = rp::render_html(d);
    std::ostringstream p;
    if (count(html, "<svg ") != 6) p << count(html, "<svg ") << " charts; ";
    for (const char* bad : {"nan", "inf\"", "\"inf", "\"-inf"}) {
      if (contains(html, bad)) p << "\"" << bad << "\" on the page; ";
    }
    const auto labels = tick_labels(chart(html, "Loss"));
    for (std::size_t i = 1; i < labels.size(); ++i) {
      if (labels[i] == labels[i - 1]) p << "Loss: two ticks labelled " << labels[i] << "; ";
    }
    return p.str();
  }));
}

TEST(ReportBounds, ASinglePointOfAnyValueIsDrawnAsOneDot) {
  for (const double v : {0.0, 1.0, -3.5, 1e17, kDenormMin, -kDenormMin, kMax, -kMax}) {
    EXPECT_HELD(run_bounded([v] {
      rp::RunData d = run_named("one");
      add(d, "train/loss", 7, v);
      const std::string svg = chart(rp::render_html(d), "Loss");
      const std::size_t dots = count(svg, "<circle ");
      std::ostringstream p;
      p.precision(17);
      if (dots != 1) p << dots << " dots for " << v;
      return p.str();
    }));
  }
}

// ---- The files -----------------------------------------------------------------------------

std::string metric_line(int step, const std::string& name, double value) {
  std::ostringstream s;
  s.precision(17);
  s << "{\"step\":" << step << ",\"name\":\"" << name << "\",\"value\":" << value << ",\"time\":" << kT0 + step
    << "}\n";
  return s.str();
}

std::string three_points() {
  return metric_line(1, "train/loss", 0.5) + metric_line(2, "train/loss", 0.4) + metric_line(3, "train/loss", 0.3);
}

TEST(ReportFiles, AHugeMetricsFileIsReadUpToItsLimitAndThePageSaysSo) {
  TempDir tmp;
  write_sparse(tmp / "metrics.jsonl", three_points(), kGiB);
  EXPECT_HELD(run_bounded([&tmp] {
    const auto run = rp::read_run(tmp.str());
    const std::string html = rp::render_html(run);
    std::string p;
    if (run.metrics.count("train/loss") == 0 || run.metrics.at("train/loss").size() != 3) p += "not 3 points; ";
    if (!contains(html, "metrics.jsonl is 1024 MiB: only its first 128 MiB read, the rest left out.")) p += "no note; ";
    if (html.size() > (1u << 20)) p += "page of " + std::to_string(html.size()) + " bytes; ";
    return p;
  }));
}

TEST(ReportFiles, AMetricsLineLongerThanTheLimitIsSkippedAndNamed) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", metric_line(1, "train/loss", 0.5) +
                                        metric_line(2, "custom/" + std::string(100000, 'x'), 1) +
                                        metric_line(3, "train/loss", 0.3));
  const auto run = rp::read_run(tmp.str());
  EXPECT_EQ(run.metrics.size(), 1u);
  EXPECT_EQ(run.malformed_lines, 1u);
  EXPECT_TRUE(contains(rp::render_html(run), "1 malformed line of metrics.jsonl skipped (line 2; longer than 16 KiB)"));
}

TEST(ReportFiles, AHugeTrainerLogIsReadFromItsEndAndThePageSaysSo) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", three_points());
  write_sparse(tmp / "trainer.log", "2026-11-24 15:24:44.630 warning first\n", kGiB,
               "\n2026-11-24 15:24:45.100 warning the last warning\n2026-11-24 15:24:46.100 info  the end\n");
  EXPECT_HELD(run_bounded([&tmp] {
    const auto run = rp::read_run(tmp.str());
    const std::string html = rp::render_html(run);
    std::string p;
    if (run.log_tail.empty() || run.log_tail.back() != "2026-11-24 15:24:46.100 info  the end") p += "no last line; ";
    if (run.log_warnings != 1) p += std::to_string(run.log_warnings) + " warnings; ";
    if (!contains(html, "trainer.log is 1024 MiB: only its last 16 MiB read")) p += "no note; ";
    if (html.size() > (1u << 20)) p += "page of " + std::to_string(html.size()) + " bytes; ";
    return p;
  }));
}

TEST(ReportFiles, AHugeStatusJsonIsNotReadAndThePageSaysSo) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", three_points());
  write_sparse(tmp / "status.json", "{\"status\":\"FINISHED\",\"message\":\"", kGiB, "\"}");
  EXPECT_HELD(run_bounded([&tmp] {
    const std::string html = rp::render_html(rp::read_run(tmp.str()));
    return contains(html, "status.json is 1024 MiB, more than the 256 KiB read: not read") ? "" : "no note";
  }));
}

TEST(ReportFiles, AHugeConfigIsCutAndThePageSaysSo) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", three_points());
  write_sparse(tmp / "config.toml", "[training]\nbatch_size = 32\n", kGiB);
  EXPECT_HELD(run_bounded([&tmp] {
    const auto run = rp::read_run(tmp.str());
    const std::string html = rp::render_html(run);
    std::string p;
    if (!run.config_toml || run.config_toml->size() != rp::kMaxConfigBytes) p += "not its first 1 MiB; ";
    if (!contains(html, "config.toml is 1024 MiB: only its first 1 MiB shown, the rest left out.")) p += "no note; ";
    if (html.size() > (8u << 20)) p += "page of " + std::to_string(html.size()) + " bytes; ";
    return p;
  }));
}

TEST(ReportFiles, FilesThatAreNotRegularFilesAreNotReadAndThePageSaysSo) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", three_points());
  ASSERT_EQ(::mkfifo((tmp / "status.json").c_str(), 0600), 0);  // opening it would wait for a writer
  fs::create_symlink("/dev/zero", tmp / "trainer.log");         // endless, without a newline
  fs::create_symlink("/dev/zero", tmp / "config.toml");
  EXPECT_HELD(run_bounded(
      [&tmp] {
        const std::string html = rp::render_html(rp::read_run(tmp.str()));
        std::string p;
        for (const char* file : {"status.json", "trainer.log", "config.toml"}) {
          if (!contains(html, (tmp / file) + " is not a regular file")) p += std::string("no note on ") + file + "; ";
        }
        return p;
      },
      30));
}

// The page is written through a temporary created new: links planted at the temporary's name
// (today's, or the pid-named one of earlier versions) and at the page's own name are replaced,
// never written through.
TEST(ReportFiles, LinksAtThePageOrItsTemporaryAreReplacedNotWrittenThrough) {
  TempDir tmp;
  fs::create_directories(tmp / "run");
  write_file(tmp / "run/metrics.jsonl", three_points());
  write_file(tmp / "outside.html", "keep me");
  for (const std::string& name :
       std::vector<std::string>{"report.html", "report.html.tmp", "report.html.tmp" + std::to_string(::getpid())}) {
    fs::create_symlink(tmp / "outside.html", tmp / ("run/" + name));
  }
  std::ostringstream err;
  ASSERT_EQ(rp::write_report(tmp / "run", "", err), 0) << err.str();
  const auto text_of = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(text_of(tmp / "outside.html"), "keep me");
  EXPECT_FALSE(fs::is_symlink(tmp / "run/report.html"));
  EXPECT_TRUE(contains(text_of(tmp / "run/report.html"), "train/loss"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp / "run/report.html.tmp")));
}

}  // namespace

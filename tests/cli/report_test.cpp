// `trainer report`: reading a run directory, the HTML page, and the page as headless Chromium draws it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <png.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "report.h"

namespace {

namespace fs = std::filesystem;
namespace rp = trainer::report;

/// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "test";
    path_ = fs::temp_directory_path() / ("trainer_report_test_" + name + "_" + std::to_string(::getpid()));
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

void write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

constexpr double kT0 = 1795533884.0;

/// One metrics.jsonl line; `value` is JSON text (a number or "\"NaN\"").
std::string metric(int step, const std::string& name, const std::string& value, double dt) {
  std::ostringstream s;
  s.precision(17);
  s << "{\"step\":" << step << ",\"name\":\"" << name << "\",\"value\":" << value << ",\"time\":" << kT0 + dt << "}\n";
  return s.str();
}

/// A run killed while it ran: every chart's metrics, two out-of-memory errors (micro-batch 32 then 16)
/// each followed by a smaller micro-batch, a NaN loss at step 50, a malformed line 3, an incomplete
/// last line, a config with markup in a string and no status.json.
void write_running_run(const std::string& dir) {
  std::string m;
  m += metric(0, "memory/allocated_mb", "100", 0) + metric(0, "memory/reserved_mb", "200", 0);
  m += "{\"step\": 3, \"name\": \"train/loss\"\n";  // line 3: malformed
  int micro = 32;
  for (int step = 10; step <= 100; step += 10) {
    const double t = step;
    if (step == 50 || step == 80) {
      m += metric(step, "oom/micro_batch_size", std::to_string(micro), t - 0.5);
      micro /= 2;
    }
    m += metric(step, "train/loss", step == 50 ? "\"NaN\"" : std::to_string(2.0 - step * 0.01), t);
    m += metric(step, "train/accuracy", std::to_string(0.5 + step * 0.004), t);
    m += metric(step, "train/lr", std::to_string(0.001 * (1 - step / 200.0)), t);
    m += metric(step, "train/samples_per_s", std::to_string(3000 + step), t);
    m += metric(step, "train/micro_batch_size", std::to_string(micro), t);
    m += metric(step, "train/grad_norm", std::to_string(1.0 / step), t);
    m += metric(step, "memory/allocated_mb", std::to_string(100 + micro), t);
    m += metric(step, "memory/reserved_mb", std::to_string(200 + micro), t);
    m += metric(step, "memory/peak_mb", std::to_string(300 + micro), t);
    if (step % 50 == 0) {
      m += metric(step, "eval/loss", std::to_string(2.5 - step * 0.01), t);
      m += metric(step, "eval/accuracy", std::to_string(0.4 + step * 0.004), t);
    }
  }
  m += metric(100, "train/loss", "1.25", 100.5);  // a second value at step 100
  m += "{\"step\":110,\"name\":\"train/lo";       // the writer was killed mid-line
  write_file(dir + "/metrics.jsonl", m);
  write_file(dir + "/config.toml", "[run]\nname = \"<script>alert('x')</script>\"\n\n[training]\nbatch_size = 32\n");
  write_file(dir + "/trainer.log",
             "2026-11-24 15:24:44.630 info  run started\n"
             "2026-11-24 15:24:45.100 warning out of memory at micro-batch 32: retrying at 16\n"
             "2026-11-24 15:24:46.100 info  step 10 | train/loss 1.9\n");
}

std::string render(const std::string& dir) { return rp::render_html(rp::read_run(dir)); }

TEST(ReportRead, KeepsEveryPointAndCountsTheLinesItSkipped) {
  TempDir tmp;
  write_running_run(tmp.str());
  const auto run = rp::read_run(tmp.str());
  EXPECT_EQ(run.malformed_lines, 1u);
  ASSERT_EQ(run.malformed_line_numbers.size(), 1u);
  EXPECT_EQ(run.malformed_line_numbers[0], 3u);
  EXPECT_TRUE(run.truncated_last_line);
  EXPECT_FALSE(run.status);
  const auto& loss = run.metrics.at("train/loss");
  ASSERT_EQ(loss.size(), 11u);
  EXPECT_TRUE(std::isnan(loss[4].value));  // step 50
  EXPECT_EQ(loss[9].step, 100);
  EXPECT_EQ(loss[10].step, 100);
  EXPECT_DOUBLE_EQ(loss[10].value, 1.25);
  EXPECT_DOUBLE_EQ(loss[0].time, kT0 + 10);
  ASSERT_TRUE(run.config_toml);
  EXPECT_EQ(run.log_warnings, 1u);
  ASSERT_EQ(run.log_problems.size(), 1u);
}

TEST(ReportRead, FindsOutOfMemoryErrorsAndMicroBatchChanges) {
  TempDir tmp;
  write_running_run(tmp.str());
  const auto run = rp::read_run(tmp.str());
  const auto ooms = rp::oom_events(run);
  ASSERT_EQ(ooms.size(), 2u);
  EXPECT_EQ(ooms[0].micro_batch, 32);
  EXPECT_EQ(ooms[1].micro_batch, 16);
  EXPECT_DOUBLE_EQ(ooms[0].time, kT0 + 49.5);
  const auto changes = rp::micro_batch_changes(run);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].from, 32);
  EXPECT_EQ(changes[0].to, 16);
  EXPECT_EQ(changes[0].step, 50);
  EXPECT_EQ(changes[1].to, 8);
}

TEST(ReportPage, RunningRunShowsChartsEventsStatusAndNotes) {
  TempDir tmp;
  write_running_run(tmp.str());
  const std::string html = render(tmp.str());
  for (const char* title : {"<h3>Loss</h3>", "<h3>Accuracy</h3>", "<h3>Learning rate</h3>", "<h3>Throughput</h3>",
                            "<h3>Memory</h3>", "<h2>Other metrics</h2>", "<h3>train/grad_norm</h3>"}) {
    EXPECT_TRUE(contains(html, title)) << title;
  }
  for (const char* label : {"OOM (micro-batch 32)", "OOM (micro-batch 16)", "micro-batch 32 → 16", "micro-batch 16 → 8",
                            "out-of-memory error", "micro-batch change"}) {
    EXPECT_TRUE(contains(html, label)) << label;
  }
  EXPECT_TRUE(contains(html, "RUNNING (or ended without closing: no status.json)"));
  EXPECT_TRUE(contains(html, "1 malformed line of metrics.jsonl skipped (line 3)"));
  EXPECT_TRUE(contains(html, "The last line of metrics.jsonl is incomplete"));
  EXPECT_TRUE(contains(html, "1 NaN/infinite value not drawn"));
  EXPECT_TRUE(contains(html, "train/loss: 1.9 at step 10"));  // a point's tooltip
  EXPECT_TRUE(contains(html, "Started (UTC)</dt><dd>2026-11-24T15:24:44Z"));
  EXPECT_TRUE(contains(html, "Last eval/accuracy</dt><dd>0.8 (step 100)"));
  EXPECT_TRUE(contains(html, "out of memory at micro-batch 32: retrying at 16"));  // the log's warning
  // train/micro_batch_size and oom/micro_batch_size are drawn as markers, not as charts of their own.
  EXPECT_FALSE(contains(html, "<h3>train/micro_batch_size</h3>"));
}

// A run resumed in place from step 60 (after running to 80): the header says so and the step
// charts mark it; resume/step gets no chart of its own.
TEST(ReportPage, AResumedRunIsMarkedWhereItResumed) {
  TempDir tmp;
  std::string m;
  for (int step = 10; step <= 80; step += 10) m += metric(step, "train/loss", std::to_string(2.0 - step * 0.01), step);
  m += metric(60, "resume/step", "60", 90);
  for (int step = 70; step <= 100; step += 10) {
    m += metric(step, "train/loss", std::to_string(1.9 - step * 0.01), step + 30);
  }
  write_file(tmp / "metrics.jsonl", m);
  const std::string html = render(tmp.str());
  EXPECT_TRUE(contains(html, "Resumed</dt><dd>1 time, at step 60 (2026-11-24T15:26:14Z)")) << html;
  EXPECT_TRUE(contains(html, "<title>resumed at step 60</title>")) << html;
  EXPECT_FALSE(contains(html, "<h3>resume/step</h3>"));
}

TEST(ReportPage, ConfigIsShownEscaped) {
  TempDir tmp;
  write_running_run(tmp.str());
  const std::string html = render(tmp.str());
  EXPECT_TRUE(contains(html, "name = &quot;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;"));
  EXPECT_TRUE(contains(html, "batch_size = 32"));
  EXPECT_FALSE(contains(html, "<script"));
}

TEST(ReportPage, IsSelfContained) {
  TempDir tmp;
  write_running_run(tmp.str());
  const std::string html = render(tmp.str());
  for (const char* ref : {"http://", "https://", "src=", "href=", "url(", "@import", "<link", "<script"}) {
    EXPECT_FALSE(contains(html, ref)) << ref;
  }
}

TEST(ReportPage, EveryPointLiesInsideItsViewBox) {
  TempDir tmp;
  write_running_run(tmp.str());
  const std::string html = render(tmp.str());
  // Each <svg viewBox="0 0 W H"> ... </svg>, and in it each dot (cx, cy) and polyline point (x,y).
  auto attribute = [](const std::string& text, std::size_t& at, const std::string& name) -> std::string {
    at = text.find(name + "=\"", at);
    if (at == std::string::npos) return "";
    const std::size_t begin = at + name.size() + 2, end = text.find('"', begin);
    at = end;
    return text.substr(begin, end - begin);
  };
  int svgs = 0, points = 0;
  for (std::size_t at = html.find("<svg "); at != std::string::npos; at = html.find("<svg ", at), ++svgs) {
    const std::string svg = html.substr(at, html.find("</svg>", at) - at);
    at += svg.size();
    std::size_t pos = 0;
    double w = 0, h = 0;
    ASSERT_EQ(std::sscanf(attribute(svg, pos, "viewBox").c_str(), "0 0 %lf %lf", &w, &h), 2);
    auto inside = [&](double x, double y) {
      ++points;
      EXPECT_TRUE(x >= 0 && x <= w && y >= 0 && y <= h) << x << "," << y << " outside 0 0 " << w << " " << h;
    };
    for (pos = svg.find("<circle "); pos != std::string::npos; pos = svg.find("<circle ", pos)) {
      const double cx = std::stod(attribute(svg, pos, "cx"));
      inside(cx, std::stod(attribute(svg, pos, "cy")));
    }
    for (pos = svg.find("<polyline "); pos != std::string::npos; pos = svg.find("<polyline ", pos)) {
      std::istringstream pairs(attribute(svg, pos, "points"));
      double x, y;
      char comma;
      while (pairs >> x >> comma >> y) inside(x, y);
    }
  }
  EXPECT_EQ(svgs, 6);  // loss, accuracy, lr, throughput, memory, train/grad_norm
  EXPECT_GT(points, 100);
}

TEST(ReportPage, ChartsOfMetricsNotLoggedAreLeftOutAndNamed) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", metric(1, "train/loss", "0.5", 0) + metric(2, "train/loss", "0.4", 1));
  const std::string html = render(tmp.str());
  EXPECT_TRUE(contains(html, "<h3>Loss</h3>"));
  EXPECT_TRUE(contains(html, "Loss: eval/loss not logged."));
  EXPECT_TRUE(contains(html, "Accuracy chart left out: train/accuracy and eval/accuracy not logged."));
  EXPECT_TRUE(contains(html, "Memory chart left out"));
  EXPECT_FALSE(contains(html, "<h3>Accuracy</h3>"));
  EXPECT_FALSE(contains(html, "<h3>Memory</h3>"));
  EXPECT_TRUE(contains(html, "No config.toml in the run directory."));
}

TEST(ReportPage, FailedRunShowsStatusMessageAndExitCode) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", metric(1, "train/loss", "0.5", 0));
  write_file(tmp / "status.json",
             R"({"status":"FAILED","exit_code":3,"global_step":1,"epoch":0,"message":"loss is NaN at step 1 <x>",)"
             R"("last_checkpoint":"","time":1795533890.0})");
  const std::string html = render(tmp.str());
  EXPECT_TRUE(contains(html, "badge s-failed\">FAILED</span>"));
  EXPECT_TRUE(contains(html, "loss is NaN at step 1 &lt;x&gt;"));
  EXPECT_TRUE(contains(html, "Exit code</dt><dd>3"));
  EXPECT_FALSE(contains(html, "RUNNING"));
  EXPECT_FALSE(contains(html, "Memory savers on"));
}

TEST(ReportPage, TheMemorySaversOnAtTheEndAreListed) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", metric(1, "train/loss", "0.5", 0));
  write_file(tmp / "status.json",
             R"({"status":"FINISHED","exit_code":0,"global_step":1,"epoch":0,"message":"","last_checkpoint":"",)"
             R"("checkpointed_blocks":6,"optimizer_moment_bits":16,"optimizer_offload":true})");
  const std::string html = render(tmp.str());
  EXPECT_TRUE(contains(html,
                       "Memory savers on</dt><dd>6 blocks checkpointed; AdamW&#39;s moments in 16 bits; AdamW&#39;s "
                       "moments in host memory"))
      << html.substr(0, 3000);
}

TEST(ReportPage, UnreadableStatusJsonIsNamed) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", "");
  write_file(tmp / "status.json", "{\"status\":");
  const std::string html = render(tmp.str());
  EXPECT_TRUE(contains(html, "UNKNOWN (status.json could not be read)"));
  EXPECT_TRUE(contains(html, "metrics.jsonl holds no metrics yet."));
}

TEST(ReportWrite, MissingRunDirectoryIsExitCode2NamingIt) {
  TempDir tmp;
  std::ostringstream err;
  EXPECT_EQ(rp::write_report(tmp / "nope", "", err), 2);
  EXPECT_TRUE(contains(err.str(), tmp / "nope")) << err.str();
  EXPECT_TRUE(contains(err.str(), "does not exist")) << err.str();
}

TEST(ReportWrite, MissingMetricsIsExitCode2NamingIt) {
  TempDir tmp;
  std::ostringstream err;
  EXPECT_EQ(rp::write_report(tmp.str(), "", err), 2);
  EXPECT_TRUE(contains(err.str(), tmp / "metrics.jsonl")) << err.str();
  EXPECT_FALSE(fs::exists(tmp / "report.html"));
}

TEST(ReportWrite, UnwritableOutputIsExitCode2NamingIt) {
  TempDir tmp;
  write_running_run(tmp.str());
  std::ostringstream err;
  EXPECT_EQ(rp::write_report(tmp.str(), tmp / "no/such/dir/r.html", err), 2);
  EXPECT_TRUE(contains(err.str(), tmp / "no/such/dir/r.html")) << err.str();
  std::ostringstream err2;
  EXPECT_EQ(rp::write_report(tmp.str(), tmp.str(), err2), 2);  // a directory
  EXPECT_TRUE(contains(err2.str(), "is a directory")) << err2.str();
}

TEST(ReportWrite, WritesRunDirReportHtmlByDefault) {
  TempDir tmp;
  write_running_run(tmp.str());
  std::ostringstream err;
  std::string written;
  ASSERT_EQ(rp::write_report(tmp.str(), "", err, &written), 0) << err.str();
  EXPECT_EQ(written, tmp / "report.html");
  EXPECT_TRUE(contains(read_file(written), "<h3>Loss</h3>"));
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.str()), fs::directory_iterator()), 4);  // no temp file left
}

TEST(NiceTicks, RoundValuesCoveringTheRange) {
  EXPECT_EQ(rp::nice_ticks(0, 240, 6, true), (std::vector<double>{0, 50, 100, 150, 200, 250}));
  EXPECT_EQ(rp::nice_ticks(0.03, 1.58, 6), (std::vector<double>{0, 0.5, 1, 1.5, 2}));
  const auto lr = rp::nice_ticks(0, 0.005, 6);
  ASSERT_EQ(lr.size(), 6u);
  EXPECT_NEAR(lr[5], 0.005, 1e-15);
  EXPECT_EQ(rp::nice_ticks(5, 5, 6, true), (std::vector<double>{4, 5, 6}));  // one value: a range around it
  EXPECT_EQ(rp::nice_ticks(2, 3, 6, true), (std::vector<double>{2, 3}));     // integer: never below 1 apart
}

// ---- Headless Chromium ---------------------------------------------------------------------

/// Chromium, or empty. Not skipped when missing: the test fails and says what to install.
std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const char* path = std::getenv("PATH");
    std::istringstream dirs(std::string(path ? path : "") + ":/usr/bin");
    for (std::string dir; std::getline(dirs, dir, ':');) {
      const std::string candidate = dir + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return "";
}

struct Browser {
  int exit_code = -1;
  double seconds = 0;
  std::string out, err;  ///< its stdout (the DOM with --dump-dom) and stderr (its log)

  /// What went wrong, for a failed assertion.
  std::string why() const {
    return (exit_code == 124 || exit_code == 137 ? "chromium did not finish within 120 s\n" : "") + err;
  }
};

/// Runs headless Chromium on `html_path` under `timeout 120`, in a process group of its own that
/// is killed whole afterwards (and if `timeout` itself does not return), so nothing is left behind.
Browser run_chromium(const std::string& chromium, const std::string& work, const std::string& html_path,
                     const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"timeout", "--kill-after=10", "120", chromium, "--headless", "--no-sandbox",
                                   "--disable-gpu", "--no-first-run", "--disable-extensions",
                                   "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
                                   "--user-data-dir=" + work + "/profile",
                                   // Console messages reach stderr as "INFO:CONSOLE...] "text", source: ...".
                                   "--enable-logging=stderr", "--v=0"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back("file://" + html_path);
  const std::string out = work + "/chromium.out", err = work + "/chromium.err";
  // Everything the child needs is made before fork: between fork and exec it only calls what is
  // safe there.
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = out_fd < 0 || err_fd < 0 ? -1 : ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    if (::dup2(out_fd, STDOUT_FILENO) < 0 || ::dup2(err_fd, STDERR_FILENO) < 0) ::_exit(127);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0) ::close(err_fd);
  Browser b;
  if (pid < 0) return b;
  ::setpgid(pid, pid);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(150)) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(-pid, SIGKILL);  // whatever Chromium left in the group
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  b.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  b.out = read_file(out);
  b.err = read_file(err);
  return b;
}

/// The console messages Chromium logged for the page (errors, uncaught exceptions, console.log).
std::vector<std::string> console_lines(const Browser& b) {
  std::vector<std::string> lines;
  std::istringstream in(b.err);
  for (std::string line; std::getline(in, line);) {
    if (contains(line, ":CONSOLE") || contains(line, "Uncaught")) lines.push_back(line);
  }
  return lines;
}

/// The report with a checker around it, for --dump-dom: the first script records every error;
/// the last one writes `<div id="report-check">` with what it found once the page is laid out. The
/// marker missing means the scripts did not run (or the checker threw).
std::string with_checker(const std::string& html) {
  const std::string head =
      "<script>window.reportErrors=[];window.addEventListener('error',function(e){"
      "window.reportErrors.push(String(e.message));});</script>";
  const std::string tail = R"(<script>(function(){
var svgs=document.querySelectorAll('svg'),minKids=1e9,minWidth=1e9;
svgs.forEach(function(s){minKids=Math.min(minKids,s.childElementCount);
  minWidth=Math.min(minWidth,s.getBoundingClientRect().width);});
var d=document.createElement('div');d.id='report-check';
d.textContent='svgs='+svgs.length+' min_children='+minKids+' min_width='+Math.round(minWidth)+
  ' errors='+window.reportErrors.length+' ['+window.reportErrors.join('|')+']';
document.body.appendChild(d);})();</script>)";
  std::string out = html;
  out.insert(out.find("<head>") + 6, head);
  out.insert(out.rfind("</body>"), tail);
  return out;
}

/// "svgs=6 min_children=40 min_width=560 errors=0" from the dumped DOM, as numbers by name; empty
/// without the marker.
std::map<std::string, double> check_marker(const std::string& dom) {
  std::map<std::string, double> values;
  const std::string start = "<div id=\"report-check\">";
  const std::size_t at = dom.find(start);
  if (at == std::string::npos) return values;
  std::istringstream words(dom.substr(at + start.size(), dom.find('[', at) - at - start.size()));
  for (std::string word; words >> word;) {
    const std::size_t eq = word.find('=');
    if (eq != std::string::npos) values[word.substr(0, eq)] = std::atof(word.c_str() + eq + 1);
  }
  for (const char* key : {"svgs", "min_children", "min_width", "errors"}) {
    if (!values.count(key)) return {};
  }
  return values;
}

struct Image {
  unsigned width = 0, height = 0;
  std::vector<unsigned char> rgb;
};

Image read_png(const std::string& path) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  Image img;
  if (!png_image_begin_read_from_file(&png, path.c_str())) return img;
  png.format = PNG_FORMAT_RGB;
  img.rgb.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, img.rgb.data(), 0, nullptr)) return {};
  img.width = png.width;
  img.height = png.height;
  return img;
}

class ReportChromium : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = find_chromium();
    ASSERT_FALSE(chromium_.empty()) << "headless chromium is needed to check how the report renders: not found "
                                       "on PATH (scripts/install-deps.sh installs it: apt-get install chromium)";
  }
  std::string chromium_;
  TempDir tmp_;
};

TEST_F(ReportChromium, RendersTheChartsWithoutConsoleErrors) {
  const std::string run = tmp_ / "run", page = tmp_ / "report.html";
  write_running_run(run);
  std::ostringstream err;
  ASSERT_EQ(rp::write_report(run, page, err), 0) << err.str();

  const Browser shot =
      run_chromium(chromium_, tmp_.str(), page, {"--screenshot=" + (tmp_ / "shot.png"), "--window-size=1280,2400"});
  ASSERT_EQ(shot.exit_code, 0) << shot.why();
  // The page has no script: any console line is an error (ConsoleErrorDetectionCatchesAThrow below
  // shows that a thrown error does reach this log).
  EXPECT_TRUE(console_lines(shot).empty()) << console_lines(shot)[0];

  const Image img = read_png(tmp_ / "shot.png");
  ASSERT_EQ(img.width, 1280u);
  ASSERT_EQ(img.height, 2400u);
  std::map<unsigned, std::size_t> colours;
  for (std::size_t i = 0; i + 2 < img.rgb.size(); i += 3) {
    ++colours[unsigned(img.rgb[i]) << 16 | unsigned(img.rgb[i + 1]) << 8 | img.rgb[i + 2]];
  }
  std::size_t background = 0;
  for (const auto& [colour, n] : colours) background = std::max(background, n);
  const double pixels = double(img.width) * img.height;
  EXPECT_GT(1.0 - background / pixels, 0.2) << "mostly one colour: a blank page?";
  EXPECT_GT(colours.size(), 50u);
  // The lines themselves are drawn: pixels of train/loss's blue, eval/loss's orange, the OOM red.
  for (const unsigned rgb : {0x1f77b4u, 0xff7f0eu, 0xd62728u}) {
    EXPECT_GT(colours[rgb], 100u) << std::hex << rgb;
  }

  write_file(tmp_ / "checked.html", with_checker(read_file(page)));
  const Browser dom = run_chromium(chromium_, tmp_.str(), tmp_ / "checked.html", {"--dump-dom"});
  ASSERT_EQ(dom.exit_code, 0) << dom.why();
  const auto check = check_marker(dom.out);
  ASSERT_FALSE(check.empty()) << "the checker did not run:\n" << dom.out.substr(0, 2000);
  EXPECT_EQ(check.at("errors"), 0) << dom.out.substr(dom.out.find("report-check"), 300);
  EXPECT_EQ(check.at("svgs"), 6);
  EXPECT_GT(check.at("min_children"), 20);  // plot, grid, ticks, axes, legend and the points
  EXPECT_GT(check.at("min_width"), 250);
}

// The two detectors above must see an error when there is one: a page that throws.
TEST_F(ReportChromium, ConsoleErrorDetectionCatchesAThrow) {
  const std::string run = tmp_ / "run";
  write_running_run(run);
  std::string html = with_checker(render(run));
  html.insert(html.rfind("</main>"), "<script>throw new Error('deliberate report error');</script>");
  write_file(tmp_ / "broken.html", html);

  const Browser shot = run_chromium(chromium_, tmp_.str(), tmp_ / "broken.html",
                                    {"--screenshot=" + (tmp_ / "shot.png"), "--window-size=800,600"});
  ASSERT_EQ(shot.exit_code, 0) << shot.why();
  const auto lines = console_lines(shot);
  ASSERT_EQ(lines.size(), 1u) << shot.err;
  EXPECT_TRUE(contains(lines[0], "Uncaught Error: deliberate report error")) << lines[0];

  const Browser dom = run_chromium(chromium_, tmp_.str(), tmp_ / "broken.html", {"--dump-dom"});
  ASSERT_EQ(dom.exit_code, 0) << dom.why();
  const auto check = check_marker(dom.out);
  ASSERT_FALSE(check.empty()) << dom.out.substr(0, 2000);
  EXPECT_EQ(check.at("errors"), 1);
  EXPECT_TRUE(contains(dom.out, "deliberate report error"));
}

// ---- The CLI (needs the trainer executable) ------------------------------------------------

struct Cli {
  int code = -1;
  std::string text;
};

Cli run_cli(const std::string& args) {
  Cli out;
  FILE* p = ::popen((std::string(TRAINER_CLI) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (const std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.text.append(buf, n);
  const int status = ::pclose(p);
  out.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

TEST(ReportCli, MissingRunDirectoryExits2NamingIt) {
  TempDir tmp;
  const auto o = run_cli("report " + (tmp / "missing_run"));
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_TRUE(contains(o.text, tmp / "missing_run")) << o.text;
}

TEST(ReportCli, WritesTheOutputFile) {
  TempDir tmp;
  write_running_run(tmp / "run");
  const auto o = run_cli("report " + (tmp / "run") + " -o " + (tmp / "out.html"));
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_TRUE(contains(read_file(tmp / "out.html"), "<h3>Memory</h3>"));
}

}  // namespace

namespace {

/// A finished run of `steps` steps: train/loss falling, eval/accuracy at the end, peak memory,
/// and a config.toml with the learning rate given.
void write_finished_run(const std::string& dir, const std::string& lr, int steps) {
  std::string m;
  for (int s = 1; s <= steps; ++s) {
    m += metric(s, "train/loss", std::to_string(2.0 / s), s);
    m += metric(s, "memory/peak_mb", std::to_string(100 + s), s);
  }
  m += metric(steps, "eval/accuracy", "0.75", steps + 1);
  write_file(dir + "/metrics.jsonl", m);
  write_file(dir + "/config.toml", "[run]\nname = \"t\"\nseed = 1\n[optim]\nname = \"adamw\"\nlr = " + lr +
                                       "\nbetas = [\n  0.9,\n  0.999,\n]\n[model]\nhidden = [32, 32]\n");
  write_file(dir + "/status.json", R"({"status":"FINISHED","exit_code":0,"global_step":)" + std::to_string(steps) +
                                       R"(,"epoch":1,"message":"","last_checkpoint":"","time":1795533890.0})");
}

TEST(ReportCompare, ConfigLeavesAreReadWithTheirTables) {
  const auto leaves = rp::config_leaves(
      "# comment\n[run]\nname = \"a = b\"\n[optim]\nlr = 0.001\nbetas = [\n  0.9,\n  0.999,\n]\n[plugins.x]\n\"odd "
      "key\" "
      "= true\n");
  EXPECT_EQ(leaves.at("run.name"), "\"a = b\"");
  EXPECT_EQ(leaves.at("optim.lr"), "0.001");
  EXPECT_EQ(leaves.at("optim.betas"), "[ 0.9, 0.999, ]");
  EXPECT_EQ(leaves.at("plugins.x.odd key"), "true");
  EXPECT_EQ(leaves.size(), 4u);
}

// Two runs overlaid: a line per run in each chart (memory in steps too), the legend naming the
// runs, the config keys that differ and only those; a run without a metric is noted.
TEST(ReportCompare, OverlaysTheRunsAndListsTheConfigKeysThatDiffer) {
  TempDir tmp;
  write_finished_run(tmp / "runs/lr-small", "0.001", 6);
  write_finished_run(tmp / "runs/lr-large", "0.01", 4);
  write_file(tmp / "runs/lr-large/metrics.jsonl",
             read_file(tmp / "runs/lr-large/metrics.jsonl") + metric(4, "train/samples_per_s", "1000", 5));
  std::vector<rp::RunData> runs{rp::read_run(tmp / "runs/lr-small"), rp::read_run(tmp / "runs/lr-large")};
  const std::string html = rp::render_comparison(runs);
  EXPECT_TRUE(contains(html, "<h1>2 runs compared</h1>")) << html;
  for (const char* chart :
       {"<h3>train/loss</h3>", "<h3>eval/accuracy</h3>", "<h3>memory/peak_mb</h3>", "<h3>train/samples_per_s</h3>"}) {
    EXPECT_TRUE(contains(html, chart)) << chart;
  }
  EXPECT_TRUE(contains(html, ">lr-small</text>")) << "the legend names the runs";
  EXPECT_TRUE(contains(html, ">lr-large</text>"));
  EXPECT_TRUE(contains(html, "<code>optim.lr</code></td><td>0.001</td><td>0.01</td>")) << html;
  EXPECT_FALSE(contains(html, "<code>optim.betas</code>"));  // the same in both
  EXPECT_FALSE(contains(html, "<code>run.seed</code>"));
  EXPECT_TRUE(contains(html, "train/samples_per_s: not logged by lr-small")) << html;
  EXPECT_TRUE(contains(html, ">6</td>")) << "the steps of each run";

  // Two runs of one name: their parents tell them apart.
  write_finished_run(tmp / "a/run", "0.1", 3);
  write_finished_run(tmp / "b/run", "0.1", 3);
  const std::string same = rp::render_comparison({rp::read_run(tmp / "a/run"), rp::read_run(tmp / "b/run")});
  EXPECT_TRUE(contains(same, "a/run")) << same;
  EXPECT_TRUE(contains(same, "The runs' configs hold the same values.")) << same;
}

TEST(ReportCompare, TheCommandWritesCompareHtmlBesideTheFirstRun) {
  TempDir tmp;
  write_finished_run(tmp / "runs/one", "0.001", 3);
  write_finished_run(tmp / "runs/two", "0.002", 3);
  const auto o = run_cli("report " + (tmp / "runs/one") + " " + (tmp / "runs/two"));
  ASSERT_EQ(o.code, 0) << o.text;
  EXPECT_TRUE(contains(o.text, tmp / "runs/compare.html")) << o.text;
  EXPECT_TRUE(contains(read_file(tmp / "runs/compare.html"), "<code>optim.lr</code>"));
  EXPECT_EQ(run_cli("report " + (tmp / "runs/one") + " " + (tmp / "missing")).code, 2);
}

}  // namespace

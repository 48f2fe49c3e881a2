#pragma once
// Parts of the report's page that render_html() puts together (private to `trainer report`): the
// stylesheet, the header with the run's status and facts, the table of out-of-memory errors.

#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

#include "report.h"

namespace trainer::report {

inline constexpr std::size_t kMaxEventRows = 200;  // rows of the out-of-memory/micro-batch table

/// `t` (seconds since the Unix epoch) as "YYYY-MM-DDTHH:MM:SSZ", "unknown" when it is not a time.
std::string iso_utc(double t);

/// The page's CSS.
extern const char* const kStyle;

/// The page's header: the run's name, its status and the facts about it.
void render_header(const RunData& d, double t_first, double t_last, std::ostringstream& h);

/// The out-of-memory errors and micro-batch changes as a table, by step; times from `t0`.
std::string events_table(const std::vector<OomEvent>& ooms, const std::vector<MicroBatchChange>& changes, double t0);

}  // namespace trainer::report

// Test support for launcher report --html's pages: the number of points of each <polyline> of
// an SVG text (a page as written, or as chromium's --dump-dom gives it back), in document order.
#pragma once

#include <algorithm>
#include <regex>
#include <string>
#include <vector>

namespace test_support {

inline std::vector<int> polyline_point_counts(const std::string& svg) {
  std::vector<int> counts;
  const std::regex polyline(R"re(<polyline[^>]* points="([^"]*)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), polyline); it != std::sregex_iterator(); ++it) {
    const std::string points = (*it)[1];
    counts.push_back(static_cast<int>(std::count(points.begin(), points.end(), ',')));
  }
  return counts;
}

}  // namespace test_support

// The definitions of visualize.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tshard/debug/visualize.hpp"

namespace tshard::detail {

TSHARD_FUNC std::string sharding_picture(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh) {
  const int rank = spec.rank;
  const Index rows = rank >= 1 ? split_parts(spec.dims[0], mesh) : 1;
  const Index cols = rank == 2 ? split_parts(spec.dims[1], mesh) : 1;
  std::vector<std::string> cell(static_cast<std::size_t>(rows * cols));
  for (int r = 0; r < mesh.size(); ++r) {
    auto c = mesh.coords_of(r);
    Index i = rank >= 1 ? split_coord(spec.dims[0], mesh, c) : 0;
    Index j = rank == 2 ? split_coord(spec.dims[1], mesh, c) : 0;
    std::string& s = cell[static_cast<std::size_t>(i * cols + j)];
    s += (s.empty() ? "" : ",") + std::to_string(r);
  }
  auto range = [&](int d, Index c, Index parts) {
    Index off = shard_offset(shape[d], parts, c), n = shard_valid(shape[d], parts, c);
    return n == 0 ? std::string("empty") : std::to_string(off) + ".." + std::to_string(off + n - 1);
  };
  std::vector<std::string> row_label(static_cast<std::size_t>(rows)), col_label(static_cast<std::size_t>(cols));
  for (Index i = 0; i < rows; ++i) row_label[i] = rank >= 1 ? "[" + range(0, i, rows) + "]" : "";
  for (Index j = 0; j < cols; ++j) col_label[j] = rank == 2 ? "[" + range(1, j, cols) + "]" : "";
  std::size_t w = 0, lw = 0;
  for (auto& s : cell) w = std::max(w, s.size() + 6);
  for (auto& s : col_label) w = std::max(w, s.size());
  for (auto& s : row_label) lw = std::max(lw, s.size());
  auto pad = [](std::string s, std::size_t n) {
    std::size_t left = (n - std::min(n, s.size())) / 2;
    return std::string(left, ' ') + s + std::string(n - std::min(n, s.size()) - left, ' ');
  };
  std::string out = "tensor " + shape_to_string(shape, rank) + " " + spec.to_string(mesh) + " on mesh " +
                    mesh.describe() + "\n";
  if (spec.partial != PartialKind::None) out += "(partial: each cell's ranks hold values still to be combined)\n";
  std::string rule = std::string(lw, ' ') + "+";
  for (Index j = 0; j < cols; ++j) rule += std::string(w, '-') + "+";
  if (rank == 2) {
    out += std::string(lw + 1, ' ');
    for (Index j = 0; j < cols; ++j) out += pad(col_label[j], w) + " ";
    out += "\n";
  }
  out += rule + "\n";
  for (Index i = 0; i < rows; ++i) {
    out += std::string(lw, ' ') + "|";
    for (Index j = 0; j < cols; ++j) out += pad("", w) + "|";
    out += "\n" + pad(row_label[i], lw) + "|";
    for (Index j = 0; j < cols; ++j) out += pad("ranks " + cell[static_cast<std::size_t>(i * cols + j)], w) + "|";
    out += "\n" + rule + "\n";
  }
  return out;
}

TSHARD_FUNC std::string sharding_svg(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh) {
  const int rank = spec.rank;
  const Index rows = split_parts(spec.dims[0], mesh), cols = rank == 2 ? split_parts(spec.dims[1], mesh) : 1;
  const Index n0 = std::max<Index>(shape[0], 1), n1 = rank == 2 ? std::max<Index>(shape[1], 1) : 1;
  const double width = 640, height = rank == 2 ? std::clamp(640.0 * double(n0) / double(n1), 80.0, 640.0) : 80.0;
  std::vector<std::string> owners(static_cast<std::size_t>(rows * cols));
  std::vector<int> first(static_cast<std::size_t>(rows * cols), -1);
  for (int r = 0; r < mesh.size(); ++r) {
    auto c = mesh.coords_of(r);
    const Index i = split_coord(spec.dims[0], mesh, c), j = rank == 2 ? split_coord(spec.dims[1], mesh, c) : 0;
    auto& o = owners[static_cast<std::size_t>(i * cols + j)];
    o += (o.empty() ? "" : ",") + std::to_string(r);
    if (first[static_cast<std::size_t>(i * cols + j)] < 0) first[static_cast<std::size_t>(i * cols + j)] = r;
  }
  std::string body, empty;
  char buf[512];
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) {
      // In a rank-1 tensor the blocks run across the picture.
      const Index a_off = shard_offset(shape[0], rows, i), a_n = shard_valid(shape[0], rows, i);
      const Index b_off = rank == 2 ? shard_offset(shape[1], cols, j) : 0, b_n = rank == 2 ? shard_valid(shape[1], cols, j) : 1;
      const std::string& who = owners[static_cast<std::size_t>(i * cols + j)];
      const std::string range = "[" + std::to_string(a_off) + ".." + std::to_string(a_off + a_n - 1) + "]" +
                                (rank == 2 ? "[" + std::to_string(b_off) + ".." + std::to_string(b_off + b_n - 1) + "]" : "");
      if (a_n == 0 || b_n == 0) {
        empty += (empty.empty() ? "" : "; ") + std::string("ranks ") + who;
        continue;
      }
      const double x = rank == 2 ? width * double(b_off) / double(n1) : width * double(a_off) / double(n0);
      const double y = rank == 2 ? height * double(a_off) / double(n0) : 0;
      const double w = rank == 2 ? width * double(b_n) / double(n1) : width * double(a_n) / double(n0);
      const double h = rank == 2 ? height * double(a_n) / double(n0) : height;
      const int hue = (first[static_cast<std::size_t>(i * cols + j)] * 137) % 360;
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"hsl(%d,60%%,75%%)\" stroke=\"black\"/>\n"
                    "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">ranks %s</text>\n"
                    "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%s</text>\n",
                    x, y, w, h, hue, x + w / 2, y + h / 2, who.c_str(), x + w / 2, y + h / 2 + 14, range.c_str());
      body += buf;
    }
  const std::string title = "tensor " + shape_to_string(shape, rank) + " " + spec.to_string(mesh) + " on mesh " + mesh.describe() +
                            (spec.partial != PartialKind::None ? " (partial)" : "");
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\">\n"
                "<text x=\"0\" y=\"14\" font-size=\"13\">%s</text>\n<g transform=\"translate(0,24)\">\n",
                width + 2, height + (empty.empty() ? 30 : 50), title.c_str());
  std::string out = buf + body + "</g>\n";
  if (!empty.empty()) {
    std::snprintf(buf, sizeof buf, "<text x=\"0\" y=\"%.0f\" font-size=\"11\">empty blocks: %s</text>\n", height + 42,
                  empty.c_str());
    out += buf;
  }
  return out + "</svg>\n";
}

}  // namespace tshard::detail

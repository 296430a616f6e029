// Saving and resuming a training run in one call each: the model's parameters and buffers, the
// optimizer's state by parameter name, the step, and the settings a resumed run must agree on,
// into one checkpoint directory (io/checkpoint.hpp: atomic, checksummed, the global tensors, so
// any mesh, ZeRO stage and rank count resumes what any other wrote).
//
//   ts::train::save_checkpoint(mesh, "ckpt", model, opt, step, {{"layers", "2"}, {"seed", "1"}});
//   long step = ts::train::load_checkpoint(mesh, "ckpt", model, opt, {{"layers", "2"}, {"seed", "1"}});
//
// A pipeline stage saves and loads its own layers: every rank calls with its stage's model, and
// the directory holds the union. Names are the state dicts' ("block0.ln1.weight",
// "block0.ln1.weight/exp_avg"); a checkpoint written under other names is read through `rename`.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tshard/core/error.hpp"
#include "tshard/io/checkpoint.hpp"
#include "tshard/nn/state.hpp"

namespace tshard::train {

// Settings a checkpoint records and a resumed run must have alike: (flag, value) pairs.
using RunSettings = std::vector<std::pair<std::string, std::string>>;

struct SaveOptions {
  // Called after each parameter is written (the number written so far): a test kills a run in
  // the middle of a save there.
  std::function<void(int)> after_each;
};

// Collective over the mesh's ranks: every parameter and buffer of `model`, the optimizer's state
// of each (ZeRO's chunks gathered; a released ZeRO-3 parameter written with its values), "step"
// and `settings`, into `dir`, atomically.
template <MeshType M, class Optimizer>
void save_checkpoint(const M& mesh, const std::string& dir, const nn::Module& model, Optimizer& opt, long step,
                     const RunSettings& settings = {}, const SaveOptions& o = {}) {
  io::CheckpointWriter out(mesh.comm(), dir);
  int written = 0;
  model.for_each_state([&](const std::string& name, const std::shared_ptr<nn::StateTensor>& t, bool buffer) {
    t->save(out, name);
    if (!buffer && o.after_each) o.after_each(++written);
  });
  opt.state_dict().save(out);
  out.set("step", std::to_string(step));
  for (const auto& [key, value] : settings) out.set(key, value);
  out.commit();
}

// Collective: the model's parameters and buffers and the optimizer's state from `dir`, which
// must have been written with the same `settings` (an IoError naming the first that differs,
// on every rank); returns the step to go on from and sets the optimizer's. `rename` maps a
// parameter or buffer name of this model to the name it has in the file, for files of an older
// naming; a buffer missing from the file keeps its value.
template <MeshType M, class Optimizer>
long load_checkpoint(const M& mesh, const std::string& dir, nn::Module& model, Optimizer& opt,
                     const RunSettings& settings = {}, const std::string& program = "tshard",
                     const std::function<std::string(const std::string&)>& rename = {}) {
  const io::CheckpointReader in(mesh.comm(), dir);
  for (const auto& [key, value] : settings) {
    const std::string saved = in.get(key);
    if (saved != value)
      throw IoError(program + ": the checkpoint '" + dir + "' was written with --" + key + " " + saved + ", this run has " +
                    value);
  }
  auto file_name = [&](const std::string& name) { return rename ? rename(name) : name; };
  opt.gather_parameters();  // ZeRO-3: every parameter present to be written
  model.for_each_state([&](const std::string& name, const std::shared_ptr<nn::StateTensor>& t, bool buffer) {
    if (buffer && !in.has(file_name(name))) return;
    t->load(in, file_name(name));
  });
  // An optimizer's state k of a parameter is "<parameter>/<state name>" (exp_avg, ...), or, in
  // checkpoints tshard wrote before state names, "<parameter>/adam<k>".
  const nn::StateDict states = opt.state_dict();
  std::map<std::string, int> index;  // each state's k among its parameter's states
  for (const auto& [name, t] : states) {
    const std::string parameter = name.substr(0, name.rfind('/'));
    const std::string older = file_name(parameter) + "/adam" + std::to_string(index[parameter]++);
    t->load(in, !in.has(file_name(name)) && in.has(older) ? older : file_name(name));
  }
  opt.load_state_dict(states);
  opt.reload_parameters();  // ZeRO-3's chunks from the loaded parameters
  const long step = std::stol(in.get("step"));
  opt.set_steps(step);
  return step;
}

}  // namespace tshard::train

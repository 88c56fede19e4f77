// dpkit's libtorch integration over the inproc transport (ranks are threads):
// at::Tensor dtype dispatch and its errors; distributed_data_parallel equals
// single-process training on the concatenated batch (gradients and SGD
// steps, with and without gradient_as_bucket_view, several buckets, the
// bucket rebuild after step 0); no_sync accumulation; find_unused_parameters
// and the error without it; a NaN on one rank skips the step everywhere; the
// reduction's norm equals torch's norm of the averaged gradients and
// clip_grad_norm matches torch::nn::utils::clip_grad_norm_; fp16 compression;
// hooks removed with the wrapper. The independent reference is always plain
// libtorch on one thread.
#include <dpkit/torch/distributed_data_parallel.hpp>
#include <dpkit/torch/tensor.hpp>
#include <dpkit/transport/inproc.hpp>

#include "torch_lm_model.hpp"
#include "../file_size_limit.hpp"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr int world = 2;

torch_lm::lm_config tiny() {
  torch_lm::lm_config c;
  c.vocab = 40;
  c.d_model = 16;
  c.heads = 2;
  c.layers = 2;
  c.max_len = 12;
  return c;
}

// A model with the reference's weights (deep copy).
torch_lm::lm copy_of(const torch_lm::lm& ref) {
  torch_lm::lm m(ref->cfg);
  torch::NoGradGuard ng;
  auto dst = m->named_parameters(true);
  for (const auto& p : ref->named_parameters(true)) dst[p.key()].copy_(p.value());
  return m;
}

// The tiny model with seeded weights (one intra-op thread: ranks are threads).
torch_lm::lm seeded_model(std::uint64_t seed) {
  torch::set_num_threads(1);
  torch::manual_seed(seed);
  return torch_lm::lm(tiny());
}

// One copy of ref per rank.
std::vector<torch_lm::lm> per_rank_copies(const torch_lm::lm& ref) { return {copy_of(ref), copy_of(ref)}; }

// Rows [rows, len] of token ids in [0, vocab), no padding (every rank has
// the same number of targets, so the mean over the concatenated batch is the
// mean of the ranks' means).
torch::Tensor rows_for(int rank, int step, std::int64_t rows, std::int64_t len, std::int64_t vocab) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(1000 * step + rank + 1));
  return torch::randint(0, vocab, {rows, len}, g, torch::kInt);
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return out;
}

// Largest |a - b| / (|b|max + tiny) over a list of tensors.
double max_rel(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].defined());
    REQUIRE(b[i].defined());
    const double scale = b[i].abs().max().item<double>() + 1e-12;
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

// Runs f(comm) on `world` inproc ranks; collects what each rank returns.
template <class R>
std::vector<R> on_ranks(const std::function<R(dpkit::inproc&)>& f) {
  std::vector<R> out(world);
  dpkit::inproc_world w(world);
  w.run([&](dpkit::inproc& comm) { out[static_cast<std::size_t>(comm.rank())] = f(comm); });
  return out;
}

struct step_out {
  std::vector<std::vector<torch::Tensor>> grads;  // per step, after finish
  std::vector<torch::Tensor> params;              // after the last step
  std::vector<dpkit::ddp_step_result> results;
  // per step: before backward, when backward returned, after finish
  std::vector<std::chrono::steady_clock::time_point> before, returned, after;
};

} // namespace

TEST_SUITE("torch") {

TEST_CASE("at::Tensor dtype dispatch: all-reduce of every supported dtype equals torch's own sum") {
  torch::set_num_threads(1);
  const std::vector<c10::ScalarType> types = {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16,
                                              torch::kInt,   torch::kLong,   torch::kChar, torch::kByte};
  for (auto st : types) {
    const std::string dtype_name = c10::toString(st);
    CAPTURE(dtype_name);
    // Small integers: exact in every type (u8 and i8 sums stay in range).
    std::vector<torch::Tensor> in(world);
    for (int r = 0; r < world; ++r) in[static_cast<std::size_t>(r)] = (torch::arange(0, 24) % 5 + r).reshape({4, 6}).to(st);
    const auto expected = (in[0].to(torch::kDouble) + in[1].to(torch::kDouble));
    auto out = on_ranks<torch::Tensor>([&](dpkit::inproc& comm) {
      auto t = in[static_cast<std::size_t>(comm.rank())].clone();
      dpkit::torch_allreduce(comm, t, dpkit::reduce_op::sum);
      return t;
    });
    for (int r = 0; r < world; ++r) {
      CHECK((out[static_cast<std::size_t>(r)].scalar_type() == st));
      CHECK(torch::equal(out[static_cast<std::size_t>(r)].to(torch::kDouble), expected));
    }
    const auto e = dpkit::torch_element_type(st);
    REQUIRE(e.has_value());
    CHECK((dpkit::torch_scalar_type(*e) == st));
  }
}

TEST_CASE("at::Tensor: views are typed and checked; non-contiguous, undefined, unsupported tensors are rejected") {
  auto t = torch::arange(12, torch::kFloat).reshape({3, 4});
  auto v = dpkit::torch_tensor_view<float>(t);
  CHECK(v.size() == 12);
  CHECK(v.data() == t.data_ptr<float>());
  CHECK(dpkit::space_of(v) == dpkit::memory_space::host);
  CHECK_THROWS_AS(dpkit::torch_tensor_view<double>(t), dpkit::invalid_argument);
  // A transpose shares the storage but is not contiguous: reducing it in place
  // would reduce the wrong elements, so it must be refused.
  CHECK_THROWS_AS(dpkit::check_torch_tensor(t.t()), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::check_torch_tensor(t.slice(1, 0, 4, 2)), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::check_torch_tensor(torch::Tensor()), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::check_torch_tensor(torch::ones({2}, torch::kBool)), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::torch_scalar_type(dpkit::element_type::u64), dpkit::invalid_argument);
  try {
    dpkit::check_torch_tensor(t.t(), "here");
    FAIL("no throw");
  } catch (const dpkit::invalid_argument& e) {
    CHECK(std::string(e.what()).find("not contiguous") != std::string::npos);
    CHECK(std::string(e.what()).find("[4, 3]") != std::string::npos);
  }
  // Non-contiguous tensors never reach a collective.
  auto res = on_ranks<int>([&](dpkit::inproc& comm) {
    auto x = torch::ones({3, 4});
    try {
      dpkit::torch_allreduce(comm, x.t());
    } catch (const dpkit::invalid_argument&) {
      return 1;
    }
    return 0;
  });
  CHECK(res == std::vector<int>{1, 1});
}

TEST_CASE("distributed_data_parallel on 2 ranks equals single-process training on the concatenated batch") {
  const auto cfg = tiny();
  auto ref = seeded_model(7);
  const int steps = 3;
  const std::int64_t rows = 2, len = 9;
  for (int mode = 0; mode < 4; ++mode) {
    const bool view = (mode & 1) != 0, comm_thread = mode < 2; // comm_thread false: all-reduces inside the hooks
    CAPTURE(view);
    CAPTURE(comm_thread);
    // Reference: one process, both ranks' rows, SGD (linear in the gradients,
    // so rounding differences stay rounding-sized).
    auto single = copy_of(ref);
    torch::optim::SGD sopt(single->parameters(), torch::optim::SGDOptions(0.1));
    std::vector<std::vector<torch::Tensor>> sgrads;
    for (int s = 0; s < steps; ++s) {
      sopt.zero_grad();
      auto batch = torch::cat({rows_for(0, s, rows, len, cfg.vocab), rows_for(1, s, rows, len, cfg.vocab)}, 0);
      torch_lm::lm_loss(single, batch).backward();
      sgrads.push_back(grads_of(*single));
      sopt.step();
    }
    std::vector<torch_lm::lm> models;
    for (int r = 0; r < world; ++r) models.push_back(copy_of(ref));
    {
      torch::NoGradGuard ng; // rank 1 starts from other weights: the broadcast must fix that
      for (auto& p : models[1]->parameters()) p.add_(1.0);
    }
    auto outs = on_ranks<step_out>([&](dpkit::inproc& comm) {
      auto& m = models[static_cast<std::size_t>(comm.rank())];
      dpkit::ddp_options o;
      o.gradient_as_bucket_view = view;
      o.comm_thread = comm_thread;
      o.bucket_cap_mb = 0.004; // several buckets (about 4 KiB each)
      o.first_bucket_cap_mb = 0.002;
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(m, comm, o);
      torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
      step_out out;
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        out.before.push_back(std::chrono::steady_clock::now());
        torch_lm::lm_loss(m, rows_for(comm.rank(), s, rows, len, cfg.vocab)).backward();
        out.returned.push_back(std::chrono::steady_clock::now());
        out.results.push_back(ddp.finish());
        out.after.push_back(std::chrono::steady_clock::now());
        out.grads.push_back(grads_of(*m));
        if (view)
          for (std::size_t i = 0; i < ddp.parameters().size(); ++i) // the grad is the bucket slice
            if (ddp.parameters()[i].grad().data_ptr() !=
                static_cast<void*>(const_cast<dpkit::gradient_reducer<dpkit::inproc>&>(ddp.reducer()).bucket_bytes(i).data()))
              out.results.back().synchronized = false;
        opt.step();
      }
      for (const auto& p : m->parameters()) out.params.push_back(p.detach().clone());
      return out;
    });
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      const auto& o = outs[static_cast<std::size_t>(r)];
      for (int s = 0; s < steps; ++s) {
        CAPTURE(s);
        CHECK(o.results[static_cast<std::size_t>(s)].synchronized);
        CHECK(o.results[static_cast<std::size_t>(s)].all_finite);
        CHECK(max_rel(o.grads[static_cast<std::size_t>(s)], sgrads[static_cast<std::size_t>(s)]) < 1e-5);
        // the exposed interval lies inside this step: from the last hook of
        // its backward to the gradients in place, before finish() returned
        const auto& res = o.results[static_cast<std::size_t>(s)];
        CHECK(o.before[static_cast<std::size_t>(s)] < res.backward_end);
        CHECK(res.backward_end <= res.ready);
        CHECK(res.ready <= o.after[static_cast<std::size_t>(s)]);
        CHECK(res.exposed_seconds == std::chrono::duration<double>(res.ready - res.backward_end).count());
        // compute_end is the engine's final callback: after the last hook,
        // before backward() returned (torch's kBackwardComputeEnd)
        CHECK(res.backward_end < res.compute_end);
        CHECK(res.compute_end < o.returned[static_cast<std::size_t>(s)]);
        CHECK(res.exposed_after_compute_seconds ==
              std::chrono::duration<double>(res.ready - res.compute_end).count());
        CHECK(res.exposed_after_compute_seconds < res.exposed_seconds);
      }
      std::vector<torch::Tensor> sparams;
      for (const auto& p : single->parameters()) sparams.push_back(p.detach());
      CHECK(max_rel(o.params, sparams) < 1e-5);
    }
    // Both ranks hold bit-identical parameters.
    for (std::size_t i = 0; i < outs[0].params.size(); ++i) CHECK(torch::equal(outs[0].params[i], outs[1].params[i]));
  }
}

TEST_CASE("no_sync accumulates locally; the next synchronized step reduces the sums") {
  const auto cfg = tiny();
  auto ref = seeded_model(11);
  const std::int64_t rows = 2, len = 7;
  auto single = copy_of(ref);
  for (int micro = 0; micro < 2; ++micro) {
    auto batch = torch::cat({rows_for(0, micro, rows, len, cfg.vocab), rows_for(1, micro, rows, len, cfg.vocab)}, 0);
    torch_lm::lm_loss(single, batch).backward(); // accumulates
  }
  const auto expected = grads_of(*single);
  for (bool view : {false, true}) {
    CAPTURE(view);
    auto models = per_rank_copies(ref);
    auto outs = on_ranks<std::vector<torch::Tensor>>([&](dpkit::inproc& comm) {
      auto& m = models[static_cast<std::size_t>(comm.rank())];
      dpkit::ddp_options o;
      o.gradient_as_bucket_view = view;
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(m, comm, o);
      {
        auto guard = ddp.no_sync();
        torch_lm::lm_loss(m, rows_for(comm.rank(), 0, rows, len, cfg.vocab)).backward();
        const auto r = ddp.finish();
        if (r.synchronized) return std::vector<torch::Tensor>{};
      }
      torch_lm::lm_loss(m, rows_for(comm.rank(), 1, rows, len, cfg.vocab)).backward();
      if (!ddp.finish().synchronized) return std::vector<torch::Tensor>{};
      return grads_of(*m);
    });
    for (const auto& g : outs) {
      REQUIRE(g.size() == expected.size());
      CHECK(max_rel(g, expected) < 1e-5);
    }
  }
}

namespace {
// Two branches; `use_b` chooses whether branch b takes part in the loss.
struct branchy_impl : torch::nn::Module {
  branchy_impl() : a(register_module("a", torch::nn::Linear(4, 3))), b(register_module("b", torch::nn::Linear(4, 3))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_b) {
    auto y = a(x);
    if (use_b) y = y + b(x);
    return y.pow(2).sum();
  }
  torch::nn::Linear a, b;
};
TORCH_MODULE_IMPL(branchy, branchy_impl);

torch::Tensor input_for(int rank) { return torch::arange(8, torch::kFloat).reshape({2, 4}) * (0.1 * (rank + 1)); }
} // namespace

TEST_CASE("find_unused_parameters: unused parameters are marked at finish; without it a clear error names them") {
  torch::set_num_threads(1);
  torch::manual_seed(3);
  branchy ref;
  auto clone_ref = [&] {
    branchy m;
    torch::NoGradGuard ng;
    auto d = m->named_parameters();
    for (const auto& p : ref->named_parameters()) d[p.key()].copy_(p.value());
    return m;
  };
  SUBCASE("used on rank 0 only, with the flag: the average of rank 0's gradient and zero") {
    std::vector<branchy> models{clone_ref(), clone_ref()};
    auto outs = on_ranks<std::vector<torch::Tensor>>([&](dpkit::inproc& comm) {
      auto& m = models[static_cast<std::size_t>(comm.rank())];
      dpkit::ddp_options o;
      o.find_unused_parameters = true;
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(m, comm, o);
      m->forward(input_for(comm.rank()), comm.rank() == 0).backward();
      const auto r = ddp.finish();
      if (r.unused_parameters != (comm.rank() == 0 ? 0u : 2u)) return std::vector<torch::Tensor>{};
      return grads_of(*m);
    });
    // Reference: per-rank gradients on one thread.
    std::vector<std::vector<torch::Tensor>> local;
    for (int r = 0; r < world; ++r) {
      auto m = clone_ref();
      m->forward(input_for(r), r == 0).backward();
      auto g = grads_of(*m);
      for (auto& t : g)
        if (!t.defined()) t = torch::zeros({0});
      local.push_back(g);
    }
    for (const auto& g : outs) {
      REQUIRE(g.size() == 4);
      for (std::size_t i = 0; i < 4; ++i) {
        auto expected = local[1][i].numel() ? (local[0][i] + local[1][i]) / 2 : local[0][i] / 2;
        CHECK(torch::allclose(g[i], expected, 1e-6, 1e-7));
      }
    }
  }
  SUBCASE("unused on both ranks without the flag: dpkit::error naming them, and the wrapper stays usable") {
    std::vector<branchy> models{clone_ref(), clone_ref()};
    auto outs = on_ranks<std::string>([&](dpkit::inproc& comm) {
      auto& m = models[static_cast<std::size_t>(comm.rank())];
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(m, comm);
      std::string msg;
      m->forward(input_for(comm.rank()), false).backward();
      try {
        (void)ddp.finish();
        msg = "no error";
      } catch (const dpkit::error& e) {
        msg = e.what();
      }
      // Next step with every parameter used works.
      m->zero_grad();
      m->forward(input_for(comm.rank()), true).backward();
      if (!ddp.finish().synchronized) msg += " | next step failed";
      return msg;
    });
    for (const auto& msg : outs) {
      CAPTURE(msg);
      CHECK(msg.find("Expected to have finished reduction in the prior iteration") != std::string::npos);
      CHECK(msg.find("'b.weight'") != std::string::npos);
      CHECK(msg.find("'b.bias'") != std::string::npos);
      CHECK(msg.find("'a.weight'") == std::string::npos);
      CHECK(msg.find("next step failed") == std::string::npos);
    }
  }
  SUBCASE("a second backward before finish() is an error, not a silent double count") {
    std::vector<branchy> models{clone_ref(), clone_ref()};
    auto outs = on_ranks<std::string>([&](dpkit::inproc& comm) {
      auto& m = models[static_cast<std::size_t>(comm.rank())];
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(m, comm);
      m->forward(input_for(comm.rank()), true).backward();
      m->forward(input_for(comm.rank()), true).backward();
      try {
        (void)ddp.finish();
      } catch (const dpkit::error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    });
    for (const auto& msg : outs) {
      CAPTURE(msg);
      CHECK(msg.find("got a gradient twice before finish()") != std::string::npos);
    }
  }
}

TEST_CASE("all_finite and the norm from the reduction: NaN on one rank skips the step on all; clipping as torch") {
  const auto cfg = tiny();
  auto ref = seeded_model(5);
  auto models = per_rank_copies(ref);
  struct out_t {
    bool finite0 = false, finite1 = true;
    double norm = 0, torch_norm = 0, clipped_norm = 0, torch_clip_returned = 0;
  };
  auto outs = on_ranks<out_t>([&](dpkit::inproc& comm) {
    auto& m = models[static_cast<std::size_t>(comm.rank())];
    dpkit::distributed_data_parallel<dpkit::inproc> ddp(m, comm);
    out_t o;
    auto loss = torch_lm::lm_loss(m, rows_for(comm.rank(), 0, 2, 8, cfg.vocab));
    loss.backward();
    const auto r0 = ddp.finish();
    o.finite0 = r0.all_finite;
    o.norm = r0.grad_norm;
    std::vector<torch::Tensor> gs;
    for (const auto& p : m->parameters()) gs.push_back(p.grad().flatten());
    o.torch_norm = torch::cat(gs).to(torch::kDouble).norm().item<double>();
    // torch's clip on a copy of the averaged gradients, ours in place.
    auto twin = copy_of(m);
    {
      auto tp = twin->parameters();
      auto mp = m->parameters();
      for (std::size_t i = 0; i < tp.size(); ++i) tp[i].mutable_grad() = mp[i].grad().clone();
    }
    const double max_norm = r0.grad_norm / 4;
    o.torch_clip_returned = torch::nn::utils::clip_grad_norm_(twin->parameters(), max_norm);
    ddp.clip_grad_norm(max_norm);
    std::vector<torch::Tensor> cs, ts;
    for (const auto& p : m->parameters()) cs.push_back(p.grad().flatten());
    for (const auto& p : twin->parameters()) ts.push_back(p.grad().flatten());
    o.clipped_norm = torch::cat(cs).to(torch::kDouble).norm().item<double>();
    if (!torch::allclose(torch::cat(cs), torch::cat(ts), 1e-6, 1e-9)) o.clipped_norm = -1;
    // Step 2: rank 1's loss is NaN.
    m->zero_grad();
    auto loss2 = torch_lm::lm_loss(m, rows_for(comm.rank(), 1, 2, 8, cfg.vocab));
    if (comm.rank() == 1) loss2 = loss2 * std::numeric_limits<float>::quiet_NaN();
    loss2.backward();
    o.finite1 = ddp.finish().all_finite;
    return o;
  });
  for (const auto& o : outs) {
    CHECK(o.finite0);
    CHECK_FALSE(o.finite1); // on both ranks, although rank 0's gradients were finite
    CHECK(o.norm == doctest::Approx(o.torch_norm).epsilon(1e-6));
    CHECK(o.torch_clip_returned == doctest::Approx(o.norm).epsilon(1e-5));
    CHECK(o.clipped_norm == doctest::Approx(o.norm / 4).epsilon(1e-5));
  }
}

TEST_CASE("fp16 and bf16 compression hooks: averaged gradients within 16-bit rounding of the uncompressed ones") {
  const auto cfg = tiny();
  auto ref = seeded_model(9);
  auto run = [&](dpkit::gradient_compression c) {
    auto models = per_rank_copies(ref);
    return on_ranks<std::vector<torch::Tensor>>([&](dpkit::inproc& comm) {
      auto& m = models[static_cast<std::size_t>(comm.rank())];
      dpkit::ddp_options o;
      o.comm_hook = c;
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(m, comm, o);
      torch_lm::lm_loss(m, rows_for(comm.rank(), 0, 2, 8, cfg.vocab)).backward();
      (void)ddp.finish();
      return grads_of(*m);
    });
  };
  const auto exact = run(dpkit::gradient_compression::none);
  const auto h = run(dpkit::gradient_compression::f16);
  const auto b = run(dpkit::gradient_compression::bf16);
  // Local (unreduced) gradients bound the rounding: each rank's g/2 is rounded
  // to 16 bits, then the sum is rounded once more.
  std::vector<std::vector<torch::Tensor>> local;
  for (int r = 0; r < world; ++r) {
    auto m = copy_of(ref);
    torch_lm::lm_loss(m, rows_for(r, 0, 2, 8, cfg.vocab)).backward();
    local.push_back(grads_of(*m));
  }
  bool rounded = false;
  for (int r = 0; r < world; ++r) {
    const auto& e = exact[static_cast<std::size_t>(r)];
    const auto& hh = h[static_cast<std::size_t>(r)];
    const auto& bb = b[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < e.size(); ++i) {
      // Per element: two roundings of the 16-bit type (f16: 2^-11, bf16: 2^-8
      // relative) of terms as large as (|g0| + |g1|) / 2, plus f16's subnormal
      // spacing 2^-24.
      const auto mag = (local[0][i].abs() + local[1][i].abs()) / 2;
      CHECK(((hh[i] - e[i]).abs() <= mag * (2 * 0x1p-11) + 0x1p-23).all().item<bool>());
      CHECK(((bb[i] - e[i]).abs() <= mag * (2 * 0x1p-8) + 1e-30).all().item<bool>());
      rounded = rounded || !torch::equal(hh[i], e[i]);
    }
  }
  CHECK(rounded); // the hook did run
}

TEST_CASE("destroying the wrapper removes its hooks: later backward passes stay local") {
  const auto cfg = tiny();
  auto ref = seeded_model(13);
  auto models = per_rank_copies(ref);
  auto outs = on_ranks<std::vector<torch::Tensor>>([&](dpkit::inproc& comm) {
    auto& m = models[static_cast<std::size_t>(comm.rank())];
    {
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(m, comm);
    }
    torch_lm::lm_loss(m, rows_for(comm.rank(), 0, 2, 8, cfg.vocab)).backward();
    return grads_of(*m);
  });
  for (int r = 0; r < world; ++r) {
    auto m = copy_of(ref);
    torch_lm::lm_loss(m, rows_for(r, 0, 2, 8, cfg.vocab)).backward();
    CHECK(max_rel(outs[static_cast<std::size_t>(r)], grads_of(*m)) == 0.0);
  }
}

TEST_CASE("a parameter whose gradient accumulator was replaced after wrapping is named, not reported as unused") {
  auto outs = on_ranks<std::string>([&](dpkit::inproc& comm) {
    torch::nn::Linear lin(3, 2);
    dpkit::distributed_data_parallel<dpkit::inproc> ddp(lin, comm);
    // What a load that changes dtype or device does through set_data: the
    // tensor forgets the accumulator the wrapper hooked.
    torch::autograd::impl::set_grad_accumulator(lin->weight, std::weak_ptr<torch::autograd::Node>());
    lin->forward(torch::ones({1, 3})).sum().backward();
    try {
      (void)ddp.finish();
    } catch (const dpkit::invalid_argument& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("wrong error type: ") + e.what();
    }
    return std::string("no error");
  });
  for (const auto& msg : outs) {
    CAPTURE(msg);
    CHECK(msg.find("gradient accumulators of 'weight' were replaced") != std::string::npos);
    CHECK(msg.find("'bias'") == std::string::npos);
  }
}

TEST_CASE("CPU buckets are symmetric memory, private with symmetric_buckets false or where /dev/shm cannot hold "
          "them; the averaged gradients equal the ranks' own gradients averaged in every case") {
  torch::set_num_threads(1);
  torch::manual_seed(11);
  // 1 049 088 parameters (4 MiB of float32): buckets of about 1 and 3 MiB,
  // above the one-shot's size, so their all-reduces run the shm two-shot or,
  // over symmetric memory, the direct path
  torch::nn::Sequential ref(torch::nn::Linear(512, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 512));
  auto copy = [&] { return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(ref->clone())); };
  auto input = [](int rank) {
    auto g = torch::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(50 + rank));
    return torch::randn({4, 512}, g);
  };
  // the reference: each rank's gradients on one thread, averaged
  std::vector<torch::Tensor> expect;
  for (int r = 0; r < world; ++r) {
    auto m = copy();
    m->forward(input(r)).pow(2).mean().backward();
    auto g = grads_of(*m);
    if (expect.empty()) expect = g;
    else
      for (std::size_t i = 0; i < g.size(); ++i) expect[i] = expect[i] + g[i];
  }
  for (auto& e : expect) e = e / static_cast<double>(world);
  for (int mode = 0; mode < 3; ++mode) {
    const bool symmetric = mode != 1, fits = mode != 2;
    CAPTURE(symmetric);
    CAPTURE(fits);
    dpkit::inproc_world w(world);
    std::optional<test_fs::file_size_limit> limit; // shared-memory objects over 64 KiB cannot be reserved
    if (!fits) limit.emplace(64 * 1024);
    std::vector<std::vector<torch::Tensor>> grads(world);
    std::vector<int> in_windows(world, -1);
    w.run([&](dpkit::inproc& comm) {
      auto m = copy();
      dpkit::ddp_options o;
      o.symmetric_buckets = symmetric;
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(m.ptr(), comm, o);
      m->forward(input(comm.rank())).pow(2).mean().backward();
      ddp.finish();
      auto& red = const_cast<dpkit::gradient_reducer<dpkit::inproc>&>(ddp.reducer());
      int n = 0;
      for (std::size_t i = 0; i < ddp.parameters().size(); ++i) {
        auto b = red.bucket_bytes(i);
        n += comm.shm()->windows()->find(b.data(), b.size(), comm.rank()).first != 0 ? 1 : 0;
      }
      in_windows[static_cast<std::size_t>(comm.rank())] = n;
      grads[static_cast<std::size_t>(comm.rank())] = grads_of(*m);
    });
    const int params = static_cast<int>(expect.size());
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      // every parameter's bucket slot lies in a symmetric window, or none does
      CHECK(in_windows[static_cast<std::size_t>(r)] == (symmetric && fits ? params : 0));
      CHECK(max_rel(grads[static_cast<std::size_t>(r)], expect) < 1e-6);
    }
    for (std::size_t i = 0; i < expect.size(); ++i) CHECK(torch::equal(grads[0][i], grads[1][i]));
  }
}

TEST_CASE("distributed_data_parallel argument errors") {
  auto outs = on_ranks<int>([&](dpkit::inproc& comm) {
    int caught = 0;
    dpkit::ddp_options o;
    o.bucket_cap_mb = 0;
    try {
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(torch::nn::Linear(2, 2), comm, o);
    } catch (const dpkit::invalid_argument&) {
      ++caught;
    }
    torch::nn::Linear lin(2, 2);
    dpkit::distributed_data_parallel<dpkit::inproc> ddp(lin, comm);
    try {
      ddp.clip_grad_norm(1.0); // before any synchronized step
    } catch (const dpkit::invalid_argument&) {
      ++caught;
    }
    auto g = ddp.no_sync();
    try {
      auto g2 = ddp.no_sync();
    } catch (const dpkit::invalid_argument&) {
      ++caught;
    }
    return caught;
  });
  CHECK(outs == std::vector<int>{3, 3});
}

} // TEST_SUITE

TEST_CASE("inter_node_every: 1 is plain DDP bitwise; k > 1 keeps nodes apart between averagings, equal after them") {
  const auto ref = seeded_model(77);
  const auto layout = dpkit::node_layout::blocks(2, 2);
  const int n = layout.size(), steps = 6;
  // params[run][rank] after every step, flattened
  auto train = [&](int k, bool set_option) {
    std::vector<std::vector<std::vector<float>>> per_step(static_cast<std::size_t>(steps),
                                                          std::vector<std::vector<float>>(static_cast<std::size_t>(n)));
    std::vector<torch_lm::lm> models;
    for (int r = 0; r < n; ++r) models.push_back(copy_of(ref));
    dpkit::inproc_world w(layout);
    w.run([&](dpkit::inproc& comm) {
      auto& model = models[static_cast<std::size_t>(comm.rank())];
      dpkit::ddp_options o;
      o.bucket_cap_mb = 0.01;
      if (set_option) o.inter_node_every = k;
      dpkit::distributed_data_parallel<dpkit::inproc> ddp(model, comm, o);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        auto loss = torch_lm::lm_loss(model, rows_for(comm.rank(), s, 2, 8, tiny().vocab));
        loss.backward();
        ddp.finish();
        opt.step();
        ddp.average_parameters();
        std::vector<float> flat;
        for (const auto& p : model->parameters()) {
          auto c = p.detach().contiguous();
          flat.insert(flat.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
        }
        per_step[static_cast<std::size_t>(s)][static_cast<std::size_t>(comm.rank())] = std::move(flat);
      }
    });
    return per_step;
  };
  const auto plain = train(1, false);
  const auto one = train(1, true);
  for (int s = 0; s < steps; ++s)
    for (int r = 0; r < n; ++r) CHECK(one[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)] == plain[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)]);
  const auto two = train(3, true); // averaged after steps 0 and 3
  for (int s = 0; s < steps; ++s) {
    const auto& v = two[static_cast<std::size_t>(s)];
    CAPTURE(s);
    CHECK(v[0] == v[1]); // a node's ranks stay identical
    CHECK(v[2] == v[3]);
    if (s % 3 == 0) CHECK(v[0] == v[2]); // everyone equal after an averaging step
    else CHECK(v[0] != v[2]);            // the nodes train apart in between
  }
  CHECK(two[5][0] != plain[5][0]); // and it is not plain DDP
  // forgetting average_parameters() is an error, not a silent drift
  dpkit::inproc_world w(layout);
  std::vector<torch_lm::lm> models;
  for (int r = 0; r < n; ++r) models.push_back(copy_of(ref));
  w.run([&](dpkit::inproc& comm) {
    dpkit::ddp_options o;
    o.inter_node_every = 2;
    dpkit::distributed_data_parallel<dpkit::inproc> ddp(models[static_cast<std::size_t>(comm.rank())], comm, o);
    for (int s = 0; s < 2; ++s) {
      auto loss = torch_lm::lm_loss(models[static_cast<std::size_t>(comm.rank())], rows_for(comm.rank(), s, 2, 8, tiny().vocab));
      loss.backward();
      if (s == 0) ddp.finish();
      else CHECK_THROWS_WITH_AS(ddp.finish(), doctest::Contains("average_parameters() was called 0 times after 1"),
                                dpkit::invalid_argument);
    }
    dpkit::ddp_options bad;
    bad.inter_node_every = 0;
    CHECK_THROWS_AS(dpkit::distributed_data_parallel<dpkit::inproc>(models[static_cast<std::size_t>(comm.rank())], comm, bad),
                    dpkit::invalid_argument);
  });
}

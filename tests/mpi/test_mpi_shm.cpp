// Shared-memory all-reduce over the MPI transport (an MPI-3 shared window on
// the node communicator), run by meson under mpiexec with 1-5 ranks on one
// node: integer results equal MPI_Allreduce's, float results are bitwise
// identical on every rank, back-to-back calls of changing sizes need no
// barrier, and a rank that never joins gives timeout_error within the
// deadline.
#include <doctest/doctest.h>

#include <dpkit/dpkit.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return MPI_UINT8_T;
  else return MPI_UINT32_T;
}
MPI_Op mpi_op(dpkit::reduce_op op) {
  switch (op) {
  case dpkit::reduce_op::prod: return MPI_PROD;
  case dpkit::reduce_op::min: return MPI_MIN;
  case dpkit::reduce_op::max: return MPI_MAX;
  default: return MPI_SUM;
  }
}

template <class T>
void check_integers() {
  dpkit::mpi comm(MPI_COMM_WORLD);
  REQUIRE(comm.shm() != nullptr); // every test rank is on this node
  const int r = comm.rank();
  std::mt19937_64 g(static_cast<unsigned>(r) * 7919u + 1);
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{100003},
                            (std::size_t{9} << 20) / sizeof(T) + 5}) // > two 4 MiB buffers: chunked
    for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::prod, dpkit::reduce_op::min, dpkit::reduce_op::max})
      for (int mode = 0; mode < 3; ++mode)
        for (bool in_place : {false, true}) {
          CAPTURE(count);
          CAPTURE(mode);
          CAPTURE(in_place);
          std::vector<T> in(count), out(count, T(0x5a)), ref(count);
          // Small values: no overflow (Open MPI's u8 sum saturates where dpkit wraps).
          for (auto& x : in) x = static_cast<T>(op == dpkit::reduce_op::prod ? 1 + g() % 2 : g() % 50);
          if (count)
            MPI_Allreduce(in.data(), ref.data(), static_cast<int>(count), mpi_type<T>(), mpi_op(op), MPI_COMM_WORLD);
          auto& res = in_place ? in : out;
          if (mode == 0) dpkit::allreduce_shm_one_shot(comm, in, res, op);
          else if (mode == 1) dpkit::allreduce_shm_two_shot(comm, in, res, op);
          else dpkit::allreduce(comm, in, res, op); // automatic: shm on one node
          std::size_t first = count;
          for (std::size_t i = 0; i < count && first == count; ++i)
            if (res[i] != ref[i]) first = i;
          CAPTURE(static_cast<int>(op));
          CAPTURE(first);
          if (first < count) {
            CAPTURE(static_cast<long long>(res[first]));
            CAPTURE(static_cast<long long>(ref[first]));
            CHECK(first == count);
          }
        }
}

} // namespace

TEST_CASE("mpi shm all-reduce equals MPI_Allreduce for integer types") {
  check_integers<std::int32_t>();
  check_integers<std::int64_t>();
  check_integers<std::uint8_t>();
}

TEST_CASE("mpi shm all-reduce of floats is bitwise identical on every rank and is the rank-order sum") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  int n = comm.size();
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{5000}, std::size_t{3} << 20})
    for (int mode = 0; mode < 2; ++mode) {
      CAPTURE(count);
      CAPTURE(mode);
      std::vector<float> all(count * static_cast<std::size_t>(n)), in(count), out(count);
      std::mt19937 g(static_cast<unsigned>(count));
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = u(g) * static_cast<float>(1 << (i % 20));
      std::memcpy(in.data(), all.data() + static_cast<std::size_t>(comm.rank()) * count, count * sizeof(float));
      if (mode == 0) dpkit::allreduce_shm_one_shot(comm, in, out);
      else dpkit::allreduce_shm_two_shot(comm, in, out);
      std::vector<float> ref(count);
      for (std::size_t i = 0; i < count; ++i) {
        float acc = all[i];
        for (int p = 1; p < n; ++p) acc += all[static_cast<std::size_t>(p) * count + i];
        ref[i] = acc;
      }
      CHECK(std::memcmp(out.data(), ref.data(), count * sizeof(float)) == 0);
      // Identity across ranks: rank 0's result, broadcast, equals this rank's.
      std::vector<float> r0 = out;
      MPI_Bcast(r0.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
      CHECK(std::memcmp(out.data(), r0.data(), count * sizeof(float)) == 0);
    }
}

TEST_CASE("mpi shm all-reduce over symmetric memory: MPI_Allreduce's result, read and written across processes "
          "directly (nothing through the segment); a rank with a private buffer makes every rank run the two-shot") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  REQUIRE(comm.shm() != nullptr);
  const int r = comm.rank(), n = comm.size();
  const std::size_t max_count = (std::size_t{9} << 20) / sizeof(std::int32_t) + 5; // out of place: non-temporal stores
  auto win_in = dpkit::allocate_symmetric(comm, (max_count + 8) * sizeof(std::int32_t));
  auto win_out = dpkit::allocate_symmetric(comm, (max_count + 8) * sizeof(std::int32_t));
  REQUIRE(win_in.shared());
  auto* seg = comm.shm();
  // bytes of this rank's segment buffers no longer holding 0xa5 (what a two-shot copied through them)
  auto mark = [&] {
    MPI_Barrier(MPI_COMM_WORLD); // no peer reads our buffers any more
    for (int b = 0; b < 2; ++b) std::memset(seg->buffer(r, b), 0xa5, seg->slot_bytes());
    MPI_Barrier(MPI_COMM_WORLD);
  };
  auto changed = [&] {
    std::size_t c = 0;
    for (int b = 0; b < 2; ++b)
      for (std::size_t i = 0; i < seg->slot_bytes(); ++i) c += seg->buffer(r, b)[i] != std::byte{0xa5};
    return c;
  };
  std::mt19937_64 g(static_cast<unsigned>(r) + 11);
  std::vector<std::int32_t> priv(max_count);
  for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{300001}, max_count})
    for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::prod, dpkit::reduce_op::min, dpkit::reduce_op::max})
      for (int place = 0; place < 3; ++place) { // 0 out of place, 1 in place, 2 rank n-1's output private
        CAPTURE(count);
        CAPTURE(static_cast<int>(op));
        CAPTURE(place);
        // offsets differ by rank: only the window must be the same
        std::int32_t* in = win_in.as<std::int32_t>().data() + r;
        std::int32_t* out = place == 1 ? in : (place == 2 && r == n - 1) ? priv.data() : win_out.as<std::int32_t>().data() + 2 * r;
        for (std::size_t i = 0; i < count; ++i)
          in[i] = static_cast<std::int32_t>(op == dpkit::reduce_op::prod ? 1 + g() % 2 : g() % 50);
        std::vector<std::int32_t> ref(count);
        MPI_Allreduce(in, ref.data(), static_cast<int>(count), MPI_INT32_T, mpi_op(op), MPI_COMM_WORLD);
        mark();
        dpkit::allreduce_shm_two_shot(comm, std::span<std::int32_t>(in, count), std::span<std::int32_t>(out, count), op);
        const std::size_t through = changed();
        if (n > 1) {
          if (place == 2) CHECK(through > 0);
          else CHECK(through == 0);
        }
        std::size_t first = count;
        for (std::size_t i = 0; i < count && first == count; ++i)
          if (out[i] != ref[i]) first = i;
        CHECK(first == count);
      }
}

TEST_CASE("mpi shm all-reduce over registered buffers (register_memory on std::vector): MPI_Allreduce's result, "
          "the whole pages direct and only the edges through the segment; the data survive the release") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  REQUIRE(comm.shm() != nullptr);
  const int r = comm.rank(), n = comm.size();
  const std::size_t count = (std::size_t{9} << 20) / sizeof(std::int32_t) + 5; // out of place: non-temporal stores
  // malloc'd buffers at offsets that differ by rank
  std::vector<std::int32_t> in_mem(count + 64), out_mem(count + 64);
  std::int32_t* in = in_mem.data() + 3 * r;
  std::int32_t* out = out_mem.data() + 7 * r + 1;
  std::mt19937_64 g(static_cast<unsigned>(r) + 29);
  for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<std::int32_t>(g() % 50);
  const std::vector<std::int32_t> before(in, in + count);
  auto* seg = comm.shm();
  {
    auto reg_in = dpkit::register_memory(comm, in, count * sizeof(std::int32_t));
    auto reg_out = dpkit::register_memory(comm, out, count * sizeof(std::int32_t));
    REQUIRE(reg_in.shared());
    REQUIRE(reg_out.shared());
    CHECK(std::memcmp(in, before.data(), count * sizeof(std::int32_t)) == 0);
    for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::max})
      for (bool in_place : {false, true}) {
        CAPTURE(static_cast<int>(op));
        CAPTURE(in_place);
        std::memcpy(in, before.data(), count * sizeof(std::int32_t));
        std::vector<std::int32_t> ref(count);
        MPI_Allreduce(in, ref.data(), static_cast<int>(count), MPI_INT32_T, mpi_op(op), MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        for (int b = 0; b < 2; ++b) std::memset(seg->buffer(r, b), 0xa5, seg->slot_bytes());
        MPI_Barrier(MPI_COMM_WORLD);
        std::int32_t* o = in_place ? in : out;
        dpkit::allreduce(comm, std::span<std::int32_t>(in, count), std::span<std::int32_t>(o, count), op);
        std::size_t through = 0;
        for (int b = 0; b < 2; ++b)
          for (std::size_t i = 0; i < seg->slot_bytes(); ++i) through += seg->buffer(r, b)[i] != std::byte{0xa5};
        // the edges only (under a page each side; the message is 9 MiB)
        if (n > 1) CHECK(through <= 4 * 4096);
        std::size_t first = count;
        for (std::size_t i = 0; i < count && first == count; ++i)
          if (o[i] != ref[i]) first = i;
        CHECK(first == count);
      }
    MPI_Barrier(MPI_COMM_WORLD);
  } // released before the vectors free their memory
  // private again, with the last result (in place: the max)
  std::vector<std::int32_t> ref(count);
  MPI_Allreduce(before.data(), ref.data(), static_cast<int>(count), MPI_INT32_T, MPI_MAX, MPI_COMM_WORLD);
  CHECK(std::memcmp(in, ref.data(), count * sizeof(std::int32_t)) == 0);
}

TEST_CASE("mpi shm: a rank that never joins gives timeout_error within the deadline") {
  dpkit::mpi comm(MPI_COMM_WORLD);
  if (comm.size() < 2) return;
  std::string kind;
  double seconds = 0;
  if (comm.rank() != comm.size() - 1) {
    dpkit::collective_options o;
    o.timeout = 300ms;
    std::vector<float> v(1000, 1.f);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      dpkit::allreduce_shm(comm, v, dpkit::reduce_op::sum, o);
      kind = "ok";
    } catch (const dpkit::timeout_error&) {
      kind = "timeout";
    } catch (const dpkit::peer_error&) {
      kind = "peer"; // another waiting rank timed out first and told this one
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK((kind == "timeout" || kind == "peer"));
    CHECK(seconds < 2.0);
  }
  // At least one waiting rank saw its own deadline pass (the others may learn
  // of it first through its fault notice).
  int timed_out = kind == "timeout" ? 1 : 0, any = 0;
  MPI_Allreduce(&timed_out, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(any == 1);
  MPI_Barrier(MPI_COMM_WORLD); // the last rank never called; its transport is freed with the others'
}

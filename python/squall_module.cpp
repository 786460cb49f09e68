// SPDX-License-Identifier: Apache-2.0
// squall._squall: the Python binding (pybind11). One `Communicator` is one squall communicator
// with its own transport (a shared-memory job of its own, or a duplicate of MPI_COMM_WORLD) and
// its compressor, chosen by name as squall-bench names them; every collective is started on
// the communicator's progress thread (the non-blocking forms) and the blocking ones wait with
// the GIL released. Buffers are NumPy arrays or anything with the buffer protocol (the Python
// package hands torch tensors over as NumPy views of the same memory): never copied.
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/by_name.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/transport/shm.hpp>
#if SQUALL_PYTHON_MPI
#include <squall/transport/mpi.hpp>

#include <mpi.h>
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <pybind11/pybind11.h>
#include <string>
#include <type_traits>
#include <utility>

#include "squall_python.hpp"

namespace py = pybind11;

namespace {

using squall::python::compressed_base;
using squall::python::state_base;

enum class dtype { f32, f64, i32, i64 };
enum class op { sum, avg, min, max };

dtype dtype_of(const py::buffer_info& b) {
  if (b.itemsize == 4 && b.format == py::format_descriptor<float>::format()) return dtype::f32;
  if (b.itemsize == 8 && b.format == py::format_descriptor<double>::format()) return dtype::f64;
  if (b.itemsize == 4 && (b.format == "i" || b.format == "l")) return dtype::i32;
  if (b.itemsize == 8 && (b.format == "l" || b.format == "q")) return dtype::i64;
  throw py::type_error("squall: arrays of float32, float64, int32 or int64 only, not format '" +
                       b.format + "'");
}

op op_of(const std::string& name) {
  if (name == "sum") return op::sum;
  if (name == "avg" || name == "mean") return op::avg;
  if (name == "min") return op::min;
  if (name == "max") return op::max;
  throw py::value_error("squall: op '" + name + "' is not sum, avg, min or max");
}

/// A writable (or, with `writable` false, readable) C-contiguous buffer's info: `b` has the
/// buffer protocol (a NumPy array), or is the package's description of a CPU torch tensor's
/// memory, the tuple (tensor, address, count, format) that squall._array checked.
py::buffer_info contiguous(const py::object& b, bool writable, const char* what) {
  if (py::isinstance<py::tuple>(b)) {
    const auto t = b.cast<py::tuple>();
    const auto format = t[3].cast<std::string>();
    const py::ssize_t itemsize = format == "f" || format == "i" ? 4 : 8;
    return py::buffer_info(reinterpret_cast<void*>(t[1].cast<std::uintptr_t>()), itemsize, format,
                           t[2].cast<py::ssize_t>());
  }
  if (PyObject_CheckBuffer(b.ptr()) == 0) {
    throw py::type_error(std::string("squall: ") + what +
                         " must be a NumPy array (or anything with the buffer protocol) or a CPU "
                         "torch tensor, not " +
                         py::str(py::type::of(b).attr("__name__")).cast<std::string>());
  }
  py::buffer_info info = py::reinterpret_borrow<py::buffer>(b).request(writable);
  py::ssize_t step = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[static_cast<std::size_t>(d)] != 1 &&
        info.strides[static_cast<std::size_t>(d)] != step) {
      throw py::value_error(std::string("squall: ") + what + " must be C-contiguous");
    }
    step *= info.shape[static_cast<std::size_t>(d)];
  }
  return info;
}

template <class F>
void with_type(dtype t, F&& f) {
  switch (t) {
    case dtype::f32:
      return f(float{});
    case dtype::f64:
      return f(double{});
    case dtype::i32:
      return f(std::int32_t{});
    case dtype::i64:
      return f(std::int64_t{});
  }
}

template <class T, class F>
void with_op(op o, F&& f) {
  switch (o) {
    case op::sum:
      return f(squall::sum_op{});
    case op::min:
      return f(squall::min_op{});
    case op::max:
      return f(squall::max_op{});
    case op::avg:
      if constexpr (std::is_floating_point_v<T>) {
        return f(squall::avg_op{});
      } else {
        throw py::value_error("squall: op 'avg' needs float32 or float64 data");
      }
  }
}

/// A squall communicator without a compressor, any transport: the dense collectives.
class dense_base {
 public:
  virtual ~dense_base() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Each collective runs blocking (`now`: on the caller's thread when nothing is in flight,
  // returning an empty request) or non-blocking (on the progress thread).
  virtual squall::request allreduce(void* data, std::size_t n, dtype t, op o, bool now) = 0;
  virtual squall::request reduce_scatter(void* data, std::size_t n, dtype t, op o, bool now) = 0;
  virtual squall::request allgather(const void* in, void* out, std::size_t n, dtype t,
                                    bool now) = 0;
  virtual squall::request broadcast(void* data, std::size_t n, dtype t, int root, bool now) = 0;
  virtual squall::request barrier(bool now) = 0;
  virtual std::uint64_t bytes_sent() const = 0;
  virtual std::size_t block_offset(std::size_t n) const = 0;
  virtual std::size_t block_count(std::size_t n) const = 0;
};

template <class Comm>
class dense final : public dense_base {
 public:
  template <class... A>
  explicit dense(A&&... a) : comm_(std::forward<A>(a)...) {}

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  squall::request allreduce(void* data, std::size_t n, dtype t, op o, bool now) override {
    squall::request r;
    with_type(t, [&]<class T>(T) {
      with_op<T>(o, [&](auto f) {
        if (now)
          comm_.allreduce(view<T>(data, n), f);
        else
          r = comm_.iallreduce(view<T>(data, n), f);
      });
    });
    return r;
  }
  squall::request reduce_scatter(void* data, std::size_t n, dtype t, op o, bool now) override {
    squall::request r;
    with_type(t, [&]<class T>(T) {
      with_op<T>(o, [&](auto f) {
        if (now)
          comm_.reduce_scatter(view<T>(data, n), f);
        else
          r = comm_.ireduce_scatter(view<T>(data, n), f);
      });
    });
    return r;
  }
  squall::request allgather(const void* in, void* out, std::size_t n, dtype t, bool now) override {
    squall::request r;
    with_type(t, [&]<class T>(T) {
      const squall::host_view<const T> input(static_cast<const T*>(in), n);
      const auto output = view<T>(out, n * static_cast<std::size_t>(size()));
      if (now)
        comm_.allgather(input, output);
      else
        r = comm_.iallgather(input, output);
    });
    return r;
  }
  squall::request broadcast(void* data, std::size_t n, dtype t, int root, bool now) override {
    squall::request r;
    with_type(t, [&]<class T>(T) {
      if (now)
        comm_.broadcast(view<T>(data, n), root);
      else
        r = comm_.ibroadcast(view<T>(data, n), root);
    });
    return r;
  }
  squall::request barrier(bool now) override {
    if (!now) return comm_.ibarrier();
    comm_.barrier();
    return {};
  }
  std::uint64_t bytes_sent() const override { return comm_.bytes_sent_total(); }
  std::size_t block_offset(std::size_t n) const override { return comm_.block_offset(n); }
  std::size_t block_count(std::size_t n) const override { return comm_.block_count(n); }

 private:
  template <class T>
  static squall::host_view<T> view(void* data, std::size_t n) {
    return squall::host_view<T>(static_cast<T*>(data), n);
  }
  Comm comm_;
};

/// The k-th communicator this process makes over shared memory: its own job, named after the
/// launcher's (squall-run, mpiexec, torchrun) with k appended, keyed alike.
squall::shm_job next_job() {
  static int made = 0;
  squall::shm_job job = squall::shm_job::from_environment();
  const int k = made++;
  if (k > 0) {
    job.name += ".c" + std::to_string(k);
    job.key = squall::shm_job::key_of(std::to_string(job.key) + "/" + std::to_string(k));
  }
  return job;
}

bool started_mpi = false;  ///< MPI was initialized here, so it is finalized here (at exit)

#if SQUALL_PYTHON_MPI
void start_mpi() {
  int ready = 0;
  MPI_Initialized(&ready);
  if (ready == 0) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    started_mpi = true;
  }
}
#endif

/// At interpreter exit (the package registers it): MPI_Finalize, if this module initialized
/// MPI (a program that initialized it itself, through mpi4py say, finalizes it itself).
void finish_mpi() {
#if SQUALL_PYTHON_MPI
  int finished = 0;
  MPI_Finalized(&finished);
  if (started_mpi && finished == 0) MPI_Finalize();
#endif
  started_mpi = false;
}

/// What Python's `_squall.Communicator` holds: a dense communicator ("none") or a compressed
/// one.
struct any_comm {
  std::unique_ptr<dense_base> dense_comm;
  std::unique_ptr<compressed_base> compressed_comm;

  dense_base& dense() {
    if (!dense_comm) {
      throw py::value_error(
          "squall: a compressing communicator runs the compressed allreduce and barrier only; "
          "make a Communicator() for the dense collectives");
    }
    return *dense_comm;
  }
  compressed_base& compressed() {
    if (!compressed_comm) throw py::value_error("squall: this communicator has no compressor");
    return *compressed_comm;
  }
  int rank() const { return dense_comm ? dense_comm->rank() : compressed_comm->rank(); }
  int size() const { return dense_comm ? dense_comm->size() : compressed_comm->size(); }
};

std::unique_ptr<any_comm> make_comm(const std::string& transport, const std::string& compressor) {
  const squall::compressor_choice choice = squall::parse_compressor(compressor);
  auto made = std::make_unique<any_comm>();
  using topology = squall::automatic_topology;
  if (transport == "shm") {
    if (choice.dense()) {
      made->dense_comm =
          std::make_unique<dense<squall::communicator<squall::shm_transport, topology>>>(
              squall::shm_transport(next_job()));
    } else {
      made->compressed_comm = squall::python::compressed_over_shm(choice, next_job());
    }
    return made;
  }
#if SQUALL_PYTHON_MPI
  if (transport == "mpi") {
    start_mpi();
    if (choice.dense()) {
      made->dense_comm =
          std::make_unique<dense<squall::communicator<squall::mpi_transport, topology>>>(
              squall::mpi_transport(MPI_COMM_WORLD));
    } else {
      made->compressed_comm = squall::python::compressed_over_mpi(choice);
    }
    return made;
  }
#endif
  throw py::value_error("squall: transport '" + transport + "' is not shm" +
                        (SQUALL_PYTHON_MPI ? " or mpi" : " (built without MPI)"));
}

/// A collective in flight, with the Python objects whose memory it uses. Dropped without
/// `wait()`, it waits at deletion (its arrays must outlive the collective); an error it met is
/// raised by the communicator's next call.
struct py_request {
  py_request(squall::request request, py::object arrays)
      : r(std::move(request)), keep(std::move(arrays)) {}
  py_request(py_request&&) = default;
  py_request& operator=(py_request&&) = default;
  ~py_request() {
    if (!r.test()) {
      py::gil_scoped_release unlocked;
      try {
        r.wait();
      } catch (...) {  // the communicator has failed; its next call says why
      }
    }
  }
  squall::request r;
  py::object keep;  ///< the arrays (and state), alive until done
  void wait() {
    {
      py::gil_scoped_release unlocked;
      r.wait();
    }
    keep = py::none();
  }
  bool test() { return r.test(); }
};

struct py_state {
  std::unique_ptr<state_base> s;
};

std::size_t count_of(const py::buffer_info& b) { return static_cast<std::size_t>(b.size); }

/// Runs `start(now)`: blocking (`now`, the GIL released, None returned) or non-blocking (a
/// Request that keeps `keep`, the Python objects whose memory the collective uses, alive).
template <class Start>
py::object run(bool now, Start&& start, py::object keep) {
  if (!now) return py::cast(py_request{start(false), std::move(keep)});
  {
    py::gil_scoped_release unlocked;
    start(true);
  }
  return py::none();
}

// The collectives' arguments checked, then run blocking or not (both bound below).
py::object allreduce(any_comm& c, const py::object& data, const std::string& o, bool now) {
  const py::buffer_info b = contiguous(data, true, "data");
  return run(
      now,
      [&](bool n) { return c.dense().allreduce(b.ptr, count_of(b), dtype_of(b), op_of(o), n); },
      data);
}

py::object allreduce_compressed(any_comm& c, const py::object& data, const py::object& state,
                                const std::string& o, bool now) {
  const py::buffer_info b = contiguous(data, true, "data");
  if (dtype_of(b) != dtype::f32) {
    throw py::type_error("squall: the compressed allreduce takes float32 data");
  }
  const op which = op_of(o);
  if (which != op::sum && which != op::avg) {
    throw py::value_error("squall: a compressed allreduce sums or averages");
  }
  auto& s = state.cast<py_state&>();
  if (s.s->count() != count_of(b)) {
    throw py::value_error("squall: a compression state of " + std::to_string(s.s->count()) +
                          " elements for data of " + std::to_string(count_of(b)));
  }
  return run(
      now,
      [&](bool n) {
        return c.compressed().allreduce(static_cast<float*>(b.ptr), count_of(b), *s.s,
                                        which == op::avg, n);
      },
      py::make_tuple(data, state));
}

py::object reduce_scatter(any_comm& c, const py::object& data, const std::string& o, bool now) {
  const py::buffer_info b = contiguous(data, true, "data");
  return run(
      now,
      [&](bool n) {
        return c.dense().reduce_scatter(b.ptr, count_of(b), dtype_of(b), op_of(o), n);
      },
      data);
}

py::object allgather(any_comm& c, const py::object& in, const py::object& out, bool now) {
  const py::buffer_info i = contiguous(in, false, "input");
  const py::buffer_info o = contiguous(out, true, "output");
  if (dtype_of(i) != dtype_of(o)) {
    throw py::type_error("squall: allgather's input and output differ in type");
  }
  if (count_of(o) != count_of(i) * static_cast<std::size_t>(c.size())) {
    throw py::value_error("squall: allgather's output must hold size x input elements");
  }
  return run(
      now, [&](bool n) { return c.dense().allgather(i.ptr, o.ptr, count_of(i), dtype_of(i), n); },
      py::make_tuple(in, out));
}

py::object broadcast(any_comm& c, const py::object& data, int root, bool now) {
  const py::buffer_info b = contiguous(data, true, "data");
  return run(
      now, [&](bool n) { return c.dense().broadcast(b.ptr, count_of(b), dtype_of(b), root, n); },
      data);
}

py::object barrier(any_comm& c, bool now) {
  return run(
      now,
      [&](bool n) {
        return c.dense_comm ? c.dense_comm->barrier(n) : c.compressed_comm->barrier(n);
      },
      py::none());
}

}  // namespace

PYBIND11_MODULE(_squall, m) {
  m.doc() = "squall's collectives (the C++ library's communicator) for NumPy arrays";
  // squall's errors as Python exceptions with squall's message.
  static py::exception<squall::error> squall_error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const squall::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const squall::error& e) {
      squall_error(e.what());
    }
  });
  m.attr("has_mpi") = py::bool_(SQUALL_PYTHON_MPI != 0);
  m.def("_finish_mpi", &finish_mpi, "MPI_Finalize if squall initialized MPI (at exit).");

  py::class_<py_request>(m, "Request")
      .def("wait", &py_request::wait, "Blocks until the collective is done; raises its error.")
      .def("test", &py_request::test, "True once the collective is done.");

  py::class_<py_state>(m, "State")
      .def_property_readonly("count", [](const py_state& s) { return s.s->count(); })
      .def_property_readonly("step", [](const py_state& s) { return s.s->step(); });

  py::class_<any_comm>(m, "Communicator")
      .def(py::init(&make_comm), py::arg("transport") = "shm", py::arg("compressor") = "none")
      .def_property_readonly("rank", &any_comm::rank)
      .def_property_readonly("size", &any_comm::size)
      .def_property_readonly(
          "bytes_sent",
          [](const any_comm& c) {
            return c.dense_comm ? c.dense_comm->bytes_sent() : c.compressed_comm->bytes_sent();
          },
          "The bytes this rank has sent in this communicator's collectives so far.")
      .def_property_readonly("compresses",
                             [](const any_comm& c) { return c.compressed_comm != nullptr; })
      .def(
          "make_state",
          [](any_comm& c, std::size_t n, std::size_t columns) {
            return py_state{c.compressed().make_state(n, columns)};
          },
          py::arg("count"), py::arg("columns") = 0)
      // the non-blocking forms return a Request; the blocking ones run on this thread
      .def(
          "iallreduce",
          [](any_comm& c, const py::object& d, const std::string& o) {
            return allreduce(c, d, o, false);
          },
          py::arg("data"), py::arg("op") = "sum")
      .def(
          "allreduce",
          [](any_comm& c, const py::object& d, const std::string& o) {
            return allreduce(c, d, o, true);
          },
          py::arg("data"), py::arg("op") = "sum")
      .def(
          "iallreduce_compressed",
          [](any_comm& c, const py::object& d, const py::object& s, const std::string& o) {
            return allreduce_compressed(c, d, s, o, false);
          },
          py::arg("data"), py::arg("state"), py::arg("op") = "sum")
      .def(
          "allreduce_compressed",
          [](any_comm& c, const py::object& d, const py::object& s, const std::string& o) {
            return allreduce_compressed(c, d, s, o, true);
          },
          py::arg("data"), py::arg("state"), py::arg("op") = "sum")
      .def(
          "ireduce_scatter",
          [](any_comm& c, const py::object& d, const std::string& o) {
            return reduce_scatter(c, d, o, false);
          },
          py::arg("data"), py::arg("op") = "sum")
      .def(
          "reduce_scatter",
          [](any_comm& c, const py::object& d, const std::string& o) {
            return reduce_scatter(c, d, o, true);
          },
          py::arg("data"), py::arg("op") = "sum")
      .def(
          "iallgather",
          [](any_comm& c, const py::object& i, const py::object& o) {
            return allgather(c, i, o, false);
          },
          py::arg("input"), py::arg("output"))
      .def(
          "allgather",
          [](any_comm& c, const py::object& i, const py::object& o) {
            return allgather(c, i, o, true);
          },
          py::arg("input"), py::arg("output"))
      .def(
          "ibroadcast",
          [](any_comm& c, const py::object& d, int root) { return broadcast(c, d, root, false); },
          py::arg("data"), py::arg("root"))
      .def(
          "broadcast",
          [](any_comm& c, const py::object& d, int root) { return broadcast(c, d, root, true); },
          py::arg("data"), py::arg("root"))
      .def("ibarrier", [](any_comm& c) { return barrier(c, false); })
      .def("barrier", [](any_comm& c) { return barrier(c, true); })
      .def("block_offset", [](any_comm& c, std::size_t n) { return c.dense().block_offset(n); })
      .def("block_count", [](any_comm& c, std::size_t n) { return c.dense().block_count(n); });
}

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

/// A writable (or, with `writable` false, readable) C-contiguous buffer's info.
py::buffer_info contiguous(const py::buffer& b, bool writable, const char* what) {
  py::buffer_info info = b.request(writable);
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
  virtual squall::request iallreduce(void* data, std::size_t n, dtype t, op o) = 0;
  virtual squall::request ireduce_scatter(void* data, std::size_t n, dtype t, op o) = 0;
  virtual squall::request iallgather(const void* in, void* out, std::size_t n, dtype t) = 0;
  virtual squall::request ibroadcast(void* data, std::size_t n, dtype t, int root) = 0;
  virtual squall::request ibarrier() = 0;
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
  squall::request iallreduce(void* data, std::size_t n, dtype t, op o) override {
    squall::request r;
    with_type(t, [&]<class T>(T) {
      with_op<T>(o, [&](auto f) { r = comm_.iallreduce(view<T>(data, n), f); });
    });
    return r;
  }
  squall::request ireduce_scatter(void* data, std::size_t n, dtype t, op o) override {
    squall::request r;
    with_type(t, [&]<class T>(T) {
      with_op<T>(o, [&](auto f) { r = comm_.ireduce_scatter(view<T>(data, n), f); });
    });
    return r;
  }
  squall::request iallgather(const void* in, void* out, std::size_t n, dtype t) override {
    squall::request r;
    with_type(t, [&]<class T>(T) {
      r = comm_.iallgather(squall::host_view<const T>(static_cast<const T*>(in), n),
                           view<T>(out, n * static_cast<std::size_t>(size())));
    });
    return r;
  }
  squall::request ibroadcast(void* data, std::size_t n, dtype t, int root) override {
    squall::request r;
    with_type(t, [&]<class T>(T) { r = comm_.ibroadcast(view<T>(data, n), root); });
    return r;
  }
  squall::request ibarrier() override { return comm_.ibarrier(); }
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
          [](any_comm& c, std::size_t n) { return py_state{c.compressed().make_state(n)}; },
          py::arg("count"))
      .def(
          "iallreduce",
          [](any_comm& c, const py::buffer& data, const std::string& o) {
            const py::buffer_info b = contiguous(data, true, "data");
            return py_request{c.dense().iallreduce(b.ptr, count_of(b), dtype_of(b), op_of(o)),
                              data};
          },
          py::arg("data"), py::arg("op") = "sum")
      .def(
          "iallreduce_compressed",
          [](any_comm& c, const py::buffer& data, py::object state, const std::string& o) {
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
              throw py::value_error("squall: a compression state of " +
                                    std::to_string(s.s->count()) + " elements for data of " +
                                    std::to_string(count_of(b)));
            }
            return py_request{c.compressed().iallreduce(static_cast<float*>(b.ptr), count_of(b),
                                                        *s.s, which == op::avg),
                              py::make_tuple(data, state)};
          },
          py::arg("data"), py::arg("state"), py::arg("op") = "sum")
      .def(
          "ireduce_scatter",
          [](any_comm& c, const py::buffer& data, const std::string& o) {
            const py::buffer_info b = contiguous(data, true, "data");
            return py_request{c.dense().ireduce_scatter(b.ptr, count_of(b), dtype_of(b), op_of(o)),
                              data};
          },
          py::arg("data"), py::arg("op") = "sum")
      .def(
          "iallgather",
          [](any_comm& c, const py::buffer& in, const py::buffer& out) {
            const py::buffer_info i = contiguous(in, false, "input");
            const py::buffer_info o = contiguous(out, true, "output");
            if (dtype_of(i) != dtype_of(o)) {
              throw py::type_error("squall: allgather's input and output differ in type");
            }
            if (count_of(o) != count_of(i) * static_cast<std::size_t>(c.size())) {
              throw py::value_error("squall: allgather's output must hold size x input elements");
            }
            return py_request{c.dense().iallgather(i.ptr, o.ptr, count_of(i), dtype_of(i)),
                              py::make_tuple(in, out)};
          },
          py::arg("input"), py::arg("output"))
      .def(
          "ibroadcast",
          [](any_comm& c, const py::buffer& data, int root) {
            const py::buffer_info b = contiguous(data, true, "data");
            return py_request{c.dense().ibroadcast(b.ptr, count_of(b), dtype_of(b), root), data};
          },
          py::arg("data"), py::arg("root"))
      .def("ibarrier",
           [](any_comm& c) {
             return py_request{
                 c.dense_comm ? c.dense_comm->ibarrier() : c.compressed_comm->ibarrier(),
                 py::none()};
           })
      .def("block_offset", [](any_comm& c, std::size_t n) { return c.dense().block_offset(n); })
      .def("block_count", [](any_comm& c, std::size_t n) { return c.dense().block_count(n); });
}

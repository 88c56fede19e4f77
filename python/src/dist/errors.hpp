// dpkit._dist_ext: dpkit's C++ exceptions as dpkit._core's Python classes.
#pragma once

#include "common.hpp"

namespace dpkit_dist {

/// dpkit's exceptions as dpkit._core's Python classes (every kind: when this
/// module and _core share pybind11's internals, as with Debian's torch,
/// this translator is tried first for _core's calls too), for this module's
/// calls and torch's (Work.wait): with torch 2.x this module is compiled
/// with torch's own pybind11, whose translators are not _core's.
/// A timeout's message as Python sees it: with " Timed out " as a word, as
/// torch's own backends say it (Gloo's "Timed out waiting 1000ms for recv
/// operation to complete"), which torch's tests and users' retry logic look
/// for (torch's suite: " (Timed out|closed|timeout) ").
inline std::string timed_out(const char* what) {
  const std::string w = what;
  return w.find(" Timed out ") != std::string::npos ? w : "dpkit: Timed out waiting for " + w;
}

inline void register_translator() {
  const py::module_ core = py::module_::import("dpkit._core");
  const auto cls = [&](const char* name) { return py::object(core.attr(name)).release().ptr(); };
  static PyObject* const error_t = cls("Error");
  static PyObject* const format_t = cls("FormatError");
  static PyObject* const stale_t = cls("StaleIndexError");
  static PyObject* const cancelled_t = cls("BuildCancelled");
  static PyObject* const timeout_t = cls("TimeoutError");
  static PyObject* const mismatch_t = cls("MismatchError");
  static PyObject* const communicator_t = cls("CommunicatorError");
  static PyObject* const peer_t = cls("PeerError");
  static PyObject* const invalid_t = cls("InvalidArgument");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dpkit::timeout_error& e) {
      PyErr_SetString(timeout_t, timed_out(e.what()).c_str());
    } catch (const dpkit::mismatch_error& e) {
      PyErr_SetString(mismatch_t, e.what());
    } catch (const dpkit::communicator_error& e) {
      PyErr_SetString(communicator_t, e.what());
    } catch (const dpkit::peer_error& e) {
      PyErr_SetString(peer_t, e.what());
    } catch (const dpkit::stale_index_error& e) {
      PyErr_SetString(stale_t, e.what());
    } catch (const dpkit::format_error& e) {
      PyErr_SetString(format_t, e.what());
    } catch (const dpkit::build_cancelled& e) {
      PyErr_SetString(cancelled_t, e.what());
    } catch (const dpkit::error& e) {
      PyErr_SetString(error_t, e.what());
    } catch (const dpkit::invalid_argument& e) {
      PyErr_SetString(invalid_t, e.what());
    }
  });
}

} // namespace dpkit_dist

// torch_lm_spm: a C interface to SentencePiece, built as a separate shared
// module that torch_lm loads with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why: Debian's libsentencepiece bundles protobuf-lite 3.14 and exports its
// symbols, while libtorch pulls in the system libprotobuf 3.21. Linked into
// one program, one library's protobuf calls bind to the other's copy: the
// program crashes in a static initializer (or aborts on protobuf's version
// check). Loaded into a local scope with deep binding, SentencePiece keeps
// its own protobuf and libtorch never sees it.
#include <sentencepiece_processor.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace {
struct handle {
  sentencepiece::SentencePieceProcessor sp;
  std::vector<int> ids;
};
void put_error(char* err, std::size_t len, const std::string& msg) {
  if (!err || len == 0) return;
  std::strncpy(err, msg.c_str(), len - 1);
  err[len - 1] = '\0';
}
} // namespace

extern "C" {

/// Loads a SentencePiece model; nullptr (and a message in err) on failure.
__attribute__((visibility("default"))) void* torch_lm_spm_open(const char* model, char* err, std::size_t err_len) {
  auto* h = new handle;
  const auto st = h->sp.Load(model);
  if (!st.ok()) {
    put_error(err, err_len, st.ToString());
    delete h;
    return nullptr;
  }
  return h;
}

/// Encodes text into piece ids; *ids stays valid until the next call on h.
/// Returns 0, or -1 with a message in err.
__attribute__((visibility("default"))) int torch_lm_spm_encode(void* h, const char* text, std::size_t len,
                                                               const int** ids, std::size_t* count, char* err,
                                                               std::size_t err_len) {
  auto* s = static_cast<handle*>(h);
  const auto st = s->sp.Encode(std::string_view(text, len), &s->ids);
  if (!st.ok()) {
    put_error(err, err_len, st.ToString());
    return -1;
  }
  *ids = s->ids.data();
  *count = s->ids.size();
  return 0;
}

/// Id of <s> and </s>.
__attribute__((visibility("default"))) int torch_lm_spm_bos(void* h) { return static_cast<handle*>(h)->sp.bos_id(); }
__attribute__((visibility("default"))) int torch_lm_spm_eos(void* h) { return static_cast<handle*>(h)->sp.eos_id(); }

/// Frees h.
__attribute__((visibility("default"))) void torch_lm_spm_close(void* h) { delete static_cast<handle*>(h); }
}

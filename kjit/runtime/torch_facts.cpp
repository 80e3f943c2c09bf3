/* Everything kjit's C packer asks of a tensor, in one call: at::TensorBase's inline accessors,
 * compiled against the PyTorch they run with (kjit/runtime/torch_facts.py builds this file
 * with that PyTorch's headers and checks its answers against PyTorch's own), where PyTorch's
 * C shim answers one question per call. `tensor` is an at::Tensor*; 0 with *out filled (the
 * storage fields only for a strided tensor that is not nested), else nonzero: PyTorch raised. */
#include <ATen/core/TensorBase.h>
#include <cstdint>

struct KjitTensorFacts {
    int32_t device_type, device_index, layout, dtype;
    int32_t nested, contiguous, requires_grad, has_storage;
    int64_t numel, storage_nbytes, storage_offset;
    void* data;
};

extern "C" __attribute__((visibility("default")))
int kjit_torch_facts(const void* tensor, KjitTensorFacts* out) noexcept {
    try {
        const at::TensorBase& t = *static_cast<const at::TensorBase*>(tensor);
        if (!t.defined()) return 1;
        c10::TensorImpl* impl = t.unsafeGetTensorImpl();
        *out = KjitTensorFacts{};
        out->nested = impl->is_nested();
        out->device_type = static_cast<int32_t>(impl->device_type());
        out->device_index = impl->device().index();
        out->layout = static_cast<int32_t>(impl->layout());
        out->dtype = static_cast<int32_t>(t.scalar_type());
        out->requires_grad = impl->requires_grad();
        if (out->nested || impl->layout() != c10::kStrided) return 0;   /* their sizes raise */
        out->contiguous = impl->is_contiguous();
        out->numel = impl->numel();
        out->has_storage = impl->has_storage();
        if (out->has_storage) {
            out->storage_nbytes = static_cast<int64_t>(impl->storage().nbytes());
            out->data = t.data_ptr();
        }
        out->storage_offset = impl->storage_offset();
        return 0;
    } catch (...) {
        return 2;
    }
}

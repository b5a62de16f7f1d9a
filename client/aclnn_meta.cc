// The C API's tensor getters and the base objects besides tensors and
// scalars (int/float/bool arrays, tensor and scalar lists): host-side
// objects that frameworks create around every operator call, which need no
// server. Declared in include/aclnn/acl_meta.h.

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aclnn/acl_meta.h"
#include "client/aclnn_state.h"

struct aclIntArray {
  std::vector<int64_t> values;
};
struct aclFloatArray {
  std::vector<float> values;
};
struct aclBoolArray {
  std::vector<bool> values;
};
struct aclTensorList {
  std::vector<const aclTensor*> tensors;  // Owned: destroyed with the list.
};
struct aclScalarList {
  std::vector<const aclScalar*> scalars;  // Owned, likewise.
};

namespace {

using opserver::Fail;

aclnnStatus Null(const char* call, const char* argument) {
  return Fail(ACLNN_ERR_PARAM_NULLPTR,
              absl::StrCat(call, ": ", argument, " is NULL"));
}

// A new[] copy of `values`, as the dims getters hand them out.
aclnnStatus CopyOut(const std::vector<int64_t>& values, int64_t** out,
                    uint64_t* count) {
  *out = new int64_t[values.size()];
  for (size_t i = 0; i < values.size(); ++i) (*out)[i] = values[i];
  *count = values.size();
  return ACLNN_SUCCESS;
}

// `value` copied, for the arrays' create calls; false (with the error set)
// for NULL values of a non-empty array.
template <typename T, typename Out>
bool CopyIn(const char* call, const T* value, uint64_t size, Out* out) {
  if (value == nullptr && size > 0) {
    Fail(0, absl::StrCat(call, ": value is NULL but size is ", size));
    return false;
  }
  out->assign(value, value + size);
  return true;
}

}  // namespace

aclnnStatus aclGetViewShape(const aclTensor* tensor, int64_t** viewDims,
                            uint64_t* viewDimsNum) {
  if (tensor == nullptr) return Null("aclGetViewShape", "tensor");
  if (viewDims == nullptr) return Null("aclGetViewShape", "viewDims");
  if (viewDimsNum == nullptr) return Null("aclGetViewShape", "viewDimsNum");
  return CopyOut(tensor->shape, viewDims, viewDimsNum);
}

aclnnStatus aclGetViewStrides(const aclTensor* tensor, int64_t** stridesValue,
                              uint64_t* stridesNum) {
  if (tensor == nullptr) return Null("aclGetViewStrides", "tensor");
  if (stridesValue == nullptr) {
    return Null("aclGetViewStrides", "stridesValue");
  }
  if (stridesNum == nullptr) return Null("aclGetViewStrides", "stridesNum");
  if (!tensor->strides.empty() || tensor->shape.empty()) {
    return CopyOut(tensor->strides, stridesValue, stridesNum);
  }
  // Created without strides: row-major, as the tensor is read.
  std::vector<int64_t> strides(tensor->shape.size());
  int64_t step = 1;
  for (size_t i = strides.size(); i-- > 0;) {
    strides[i] = step;
    step *= tensor->shape[i] > 0 ? tensor->shape[i] : 1;
  }
  return CopyOut(strides, stridesValue, stridesNum);
}

aclnnStatus aclGetViewOffset(const aclTensor* tensor, int64_t* offset) {
  if (tensor == nullptr) return Null("aclGetViewOffset", "tensor");
  if (offset == nullptr) return Null("aclGetViewOffset", "offset");
  *offset = tensor->offset;
  return ACLNN_SUCCESS;
}

aclnnStatus aclGetStorageShape(const aclTensor* tensor, int64_t** storageDims,
                               uint64_t* storageDimsNum) {
  if (tensor == nullptr) return Null("aclGetStorageShape", "tensor");
  if (storageDims == nullptr) return Null("aclGetStorageShape", "storageDims");
  if (storageDimsNum == nullptr) {
    return Null("aclGetStorageShape", "storageDimsNum");
  }
  return CopyOut(tensor->storage_shape, storageDims, storageDimsNum);
}

aclnnStatus aclGetFormat(const aclTensor* tensor, aclFormat* format) {
  if (tensor == nullptr) return Null("aclGetFormat", "tensor");
  if (format == nullptr) return Null("aclGetFormat", "format");
  *format = tensor->format;
  return ACLNN_SUCCESS;
}

aclnnStatus aclGetDataType(const aclTensor* tensor, aclDataType* dataType) {
  if (tensor == nullptr) return Null("aclGetDataType", "tensor");
  if (dataType == nullptr) return Null("aclGetDataType", "dataType");
  *dataType = tensor->dtype;
  return ACLNN_SUCCESS;
}

aclIntArray* aclCreateIntArray(const int64_t* value, uint64_t size) {
  auto* array = new aclIntArray;
  if (!CopyIn("aclCreateIntArray", value, size, &array->values)) {
    delete array;
    return nullptr;
  }
  return array;
}

aclnnStatus aclDestroyIntArray(const aclIntArray* array) {
  if (array == nullptr) return Null("aclDestroyIntArray", "array");
  delete array;
  return ACLNN_SUCCESS;
}

aclnnStatus aclGetIntArraySize(const aclIntArray* array, uint64_t* size) {
  if (array == nullptr) return Null("aclGetIntArraySize", "array");
  if (size == nullptr) return Null("aclGetIntArraySize", "size");
  *size = array->values.size();
  return ACLNN_SUCCESS;
}

aclFloatArray* aclCreateFloatArray(const float* value, uint64_t size) {
  auto* array = new aclFloatArray;
  if (!CopyIn("aclCreateFloatArray", value, size, &array->values)) {
    delete array;
    return nullptr;
  }
  return array;
}

aclnnStatus aclDestroyFloatArray(const aclFloatArray* array) {
  if (array == nullptr) return Null("aclDestroyFloatArray", "array");
  delete array;
  return ACLNN_SUCCESS;
}

aclnnStatus aclGetFloatArraySize(const aclFloatArray* array, uint64_t* size) {
  if (array == nullptr) return Null("aclGetFloatArraySize", "array");
  if (size == nullptr) return Null("aclGetFloatArraySize", "size");
  *size = array->values.size();
  return ACLNN_SUCCESS;
}

aclBoolArray* aclCreateBoolArray(const bool* value, uint64_t size) {
  auto* array = new aclBoolArray;
  if (!CopyIn("aclCreateBoolArray", value, size, &array->values)) {
    delete array;
    return nullptr;
  }
  return array;
}

aclnnStatus aclDestroyBoolArray(const aclBoolArray* array) {
  if (array == nullptr) return Null("aclDestroyBoolArray", "array");
  delete array;
  return ACLNN_SUCCESS;
}

aclnnStatus aclGetBoolArraySize(const aclBoolArray* array, uint64_t* size) {
  if (array == nullptr) return Null("aclGetBoolArraySize", "array");
  if (size == nullptr) return Null("aclGetBoolArraySize", "size");
  *size = array->values.size();
  return ACLNN_SUCCESS;
}

namespace {

// A list of `size` non-NULL elements from `value`; NULL (with the error
// set) otherwise. The list takes them over.
template <typename List, typename Element>
List* CreateList(const char* call, const Element* const* value, uint64_t size,
                 std::vector<const Element*> List::*members) {
  if (value == nullptr && size > 0) {
    Fail(0, absl::StrCat(call, ": value is NULL but size is ", size));
    return nullptr;
  }
  for (uint64_t i = 0; i < size; ++i) {
    if (value[i] == nullptr) {
      Fail(0, absl::StrCat(call, ": element ", i, " is NULL"));
      return nullptr;
    }
  }
  auto* list = new List;
  (list->*members).assign(value, value + size);
  return list;
}

}  // namespace

aclTensorList* aclCreateTensorList(const aclTensor* const* value,
                                   uint64_t size) {
  return CreateList("aclCreateTensorList", value, size,
                    &aclTensorList::tensors);
}

aclnnStatus aclDestroyTensorList(const aclTensorList* array) {
  if (array == nullptr) return Null("aclDestroyTensorList", "array");
  for (const aclTensor* tensor : array->tensors) delete tensor;
  delete array;
  return ACLNN_SUCCESS;
}

aclnnStatus aclGetTensorListSize(const aclTensorList* tensorList,
                                 uint64_t* size) {
  if (tensorList == nullptr) {
    return Null("aclGetTensorListSize", "tensorList");
  }
  if (size == nullptr) return Null("aclGetTensorListSize", "size");
  *size = tensorList->tensors.size();
  return ACLNN_SUCCESS;
}

aclScalarList* aclCreateScalarList(const aclScalar* const* value,
                                   uint64_t size) {
  return CreateList("aclCreateScalarList", value, size,
                    &aclScalarList::scalars);
}

aclnnStatus aclDestroyScalarList(const aclScalarList* array) {
  if (array == nullptr) return Null("aclDestroyScalarList", "array");
  for (const aclScalar* scalar : array->scalars) delete scalar;
  delete array;
  return ACLNN_SUCCESS;
}

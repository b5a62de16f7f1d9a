// The tensor getters and the base objects of include/aclnn/acl_meta.h,
// without a server: what each reports back, and CANN's status for every
// NULL argument, with a message naming the call and the argument.

#include <cstdint>
#include <string>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<int64_t> Take(int64_t* values, uint64_t n) {
  std::vector<int64_t> v(values, values + n);
  delete[] values;
  return v;
}

TEST(AclnnMetaTest, TensorGettersReportWhatItWasCreatedWith) {
  const int64_t shape[] = {2, 3, 4};
  const int64_t strides[] = {1, 2, 6};
  const int64_t storage[] = {24};
  char base[96];
  aclTensor* t = aclCreateTensor(shape, 3, ACL_FLOAT16, strides, 5,
                                 ACL_FORMAT_NCL, storage, 1, base);
  ASSERT_NE(t, nullptr);
  int64_t* dims = nullptr;
  uint64_t n = 0;
  ASSERT_EQ(aclGetViewShape(t, &dims, &n), ACLNN_SUCCESS);
  EXPECT_THAT(Take(dims, n), ElementsAre(2, 3, 4));
  ASSERT_EQ(aclGetViewStrides(t, &dims, &n), ACLNN_SUCCESS);
  EXPECT_THAT(Take(dims, n), ElementsAre(1, 2, 6));
  ASSERT_EQ(aclGetStorageShape(t, &dims, &n), ACLNN_SUCCESS);
  EXPECT_THAT(Take(dims, n), ElementsAre(24));
  int64_t offset = -1;
  ASSERT_EQ(aclGetViewOffset(t, &offset), ACLNN_SUCCESS);
  EXPECT_EQ(offset, 5);
  aclFormat format = ACL_FORMAT_ND;
  ASSERT_EQ(aclGetFormat(t, &format), ACLNN_SUCCESS);
  EXPECT_EQ(format, ACL_FORMAT_NCL);  // Kept, though not used.
  aclDataType dtype = ACL_FLOAT;
  ASSERT_EQ(aclGetDataType(t, &dtype), ACLNN_SUCCESS);
  EXPECT_EQ(dtype, ACL_FLOAT16);
  EXPECT_EQ(aclDestroyTensor(t), ACLNN_SUCCESS);

  // Without strides: row-major ones; a 0-dim tensor has none.
  aclTensor* c = aclCreateTensor(shape, 3, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND,
                                 shape, 3, base);
  ASSERT_EQ(aclGetViewStrides(c, &dims, &n), ACLNN_SUCCESS);
  EXPECT_THAT(Take(dims, n), ElementsAre(12, 4, 1));
  aclDestroyTensor(c);
  aclTensor* scalar = aclCreateTensor(nullptr, 0, ACL_FLOAT, nullptr, 0,
                                      ACL_FORMAT_ND, nullptr, 0, base);
  ASSERT_EQ(aclGetViewShape(scalar, &dims, &n), ACLNN_SUCCESS);
  EXPECT_EQ(n, 0u);
  delete[] dims;
  ASSERT_EQ(aclGetViewStrides(scalar, &dims, &n), ACLNN_SUCCESS);
  EXPECT_EQ(n, 0u);
  delete[] dims;
  aclDestroyTensor(scalar);
}

TEST(AclnnMetaTest, NullArgumentsAreParamNullptrNamingTheArgument) {
  const int64_t shape[] = {4};
  char base[16];
  aclTensor* t = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND,
                                 shape, 1, base);
  int64_t* dims;
  uint64_t n;
  int64_t offset;
  aclFormat format;
  aclDataType dtype;
  const struct {
    aclnnStatus status;
    const char* message;
  } cases[] = {
      {aclGetViewShape(nullptr, &dims, &n), "aclGetViewShape: tensor is NULL"},
      {aclGetViewShape(t, nullptr, &n), "aclGetViewShape: viewDims is NULL"},
      {aclGetViewShape(t, &dims, nullptr),
       "aclGetViewShape: viewDimsNum is NULL"},
      {aclGetViewStrides(nullptr, &dims, &n), "aclGetViewStrides: tensor"},
      {aclGetViewStrides(t, nullptr, &n), "stridesValue is NULL"},
      {aclGetViewStrides(t, &dims, nullptr), "stridesNum is NULL"},
      {aclGetStorageShape(nullptr, &dims, &n), "aclGetStorageShape: tensor"},
      {aclGetStorageShape(t, nullptr, &n), "storageDims is NULL"},
      {aclGetStorageShape(t, &dims, nullptr), "storageDimsNum is NULL"},
      {aclGetViewOffset(nullptr, &offset), "aclGetViewOffset: tensor"},
      {aclGetViewOffset(t, nullptr), "aclGetViewOffset: offset is NULL"},
      {aclGetFormat(nullptr, &format), "aclGetFormat: tensor"},
      {aclGetFormat(t, nullptr), "aclGetFormat: format is NULL"},
      {aclGetDataType(nullptr, &dtype), "aclGetDataType: tensor"},
      {aclGetDataType(t, nullptr), "aclGetDataType: dataType is NULL"},
      {aclDestroyIntArray(nullptr), "aclDestroyIntArray: array is NULL"},
      {aclDestroyFloatArray(nullptr), "aclDestroyFloatArray: array"},
      {aclDestroyBoolArray(nullptr), "aclDestroyBoolArray: array"},
      {aclDestroyTensorList(nullptr), "aclDestroyTensorList: array"},
      {aclDestroyScalarList(nullptr), "aclDestroyScalarList: array"},
      {aclGetIntArraySize(nullptr, &n), "aclGetIntArraySize: array"},
      {aclGetFloatArraySize(nullptr, &n), "aclGetFloatArraySize: array"},
      {aclGetBoolArraySize(nullptr, &n), "aclGetBoolArraySize: array"},
      {aclGetTensorListSize(nullptr, &n), "aclGetTensorListSize: tensorList"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.status, ACLNN_ERR_PARAM_NULLPTR) << c.message;
  }
  // The message of the last call is the thread's.
  EXPECT_EQ(aclGetDataType(t, nullptr), ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_THAT(std::string(aclGetRecentErrMsg()),
              HasSubstr("aclGetDataType: dataType is NULL"));
  aclIntArray* ints = aclCreateIntArray(nullptr, 0);
  ASSERT_NE(ints, nullptr);
  EXPECT_EQ(aclGetIntArraySize(ints, nullptr), ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_THAT(std::string(aclGetRecentErrMsg()),
              HasSubstr("aclGetIntArraySize: size is NULL"));
  aclDestroyIntArray(ints);
  aclDestroyTensor(t);
}

TEST(AclnnMetaTest, ArraysCopyTheirValues) {
  int64_t ints[] = {3, -1, 1 << 30};
  aclIntArray* i = aclCreateIntArray(ints, 3);
  ints[0] = 99;  // Copied: the array does not see it.
  uint64_t n = 0;
  ASSERT_EQ(aclGetIntArraySize(i, &n), ACLNN_SUCCESS);
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(aclDestroyIntArray(i), ACLNN_SUCCESS);

  const float floats[] = {0.5f, -2.0f};
  aclFloatArray* f = aclCreateFloatArray(floats, 2);
  ASSERT_EQ(aclGetFloatArraySize(f, &n), ACLNN_SUCCESS);
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(aclDestroyFloatArray(f), ACLNN_SUCCESS);

  const bool bools[] = {true, false, true, true};
  aclBoolArray* b = aclCreateBoolArray(bools, 4);
  ASSERT_EQ(aclGetBoolArraySize(b, &n), ACLNN_SUCCESS);
  EXPECT_EQ(n, 4u);
  EXPECT_EQ(aclDestroyBoolArray(b), ACLNN_SUCCESS);

  // NULL values with a size: NULL, and the message says why.
  EXPECT_EQ(aclCreateIntArray(nullptr, 2), nullptr);
  EXPECT_THAT(std::string(aclGetRecentErrMsg()),
              HasSubstr("aclCreateIntArray: value is NULL but size is 2"));
  EXPECT_EQ(aclCreateFloatArray(nullptr, 1), nullptr);
  EXPECT_EQ(aclCreateBoolArray(nullptr, 1), nullptr);
}

// A list owns its members: destroying it destroys them (ASan would report
// a leak otherwise, and a double free if the test destroyed them too).
TEST(AclnnMetaTest, ListsOwnTheirMembers) {
  const int64_t shape[] = {4};
  char base[16];
  const aclTensor* tensors[] = {aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                                ACL_FORMAT_ND, shape, 1, base),
                                aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                                ACL_FORMAT_ND, shape, 1, base)};
  aclTensorList* list = aclCreateTensorList(tensors, 2);
  uint64_t n = 0;
  ASSERT_EQ(aclGetTensorListSize(list, &n), ACLNN_SUCCESS);
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(aclDestroyTensorList(list), ACLNN_SUCCESS);

  float one = 1;
  const aclScalar* scalars[] = {aclCreateScalar(&one, ACL_FLOAT)};
  aclScalarList* slist = aclCreateScalarList(scalars, 1);
  ASSERT_NE(slist, nullptr);
  EXPECT_EQ(aclDestroyScalarList(slist), ACLNN_SUCCESS);

  // A NULL member refuses the whole list, which then owns nothing.
  const aclTensor* with_null[] = {nullptr};
  EXPECT_EQ(aclCreateTensorList(with_null, 1), nullptr);
  EXPECT_THAT(std::string(aclGetRecentErrMsg()),
              HasSubstr("aclCreateTensorList: element 0 is NULL"));
  EXPECT_EQ(aclCreateScalarList(nullptr, 3), nullptr);
  aclTensorList* empty = aclCreateTensorList(nullptr, 0);
  ASSERT_NE(empty, nullptr);
  ASSERT_EQ(aclGetTensorListSize(empty, &n), ACLNN_SUCCESS);
  EXPECT_EQ(n, 0u);
  aclDestroyTensorList(empty);
}

}  // namespace

#pragma once
// Private: the dataset "text" (text_dataset.cpp).
#include "trainer/data.h"

namespace trainer::detail {

/// Adds the dataset "text" to the dataset registry `r`.
void add_text_dataset(Registry<DatasetFactory>& r);

}  // namespace trainer::detail

#pragma once
// Private: the image datasets of the registry ("image_folder", "flowers102", "cub200").
#include "trainer/data.h"

namespace trainer {

/// Adds the image datasets to the dataset registry `r`.
void add_image_datasets(Registry<DatasetFactory>& r);

}  // namespace trainer

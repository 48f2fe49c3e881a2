#pragma once
// Private: the datasets of numbers in files ("csv": CSV/TSV, "npy": NumPy's .npy arrays,
// "npz": their archives).
#include "trainer/data.h"

namespace trainer {

/// Adds the array datasets to the dataset registry `r`.
void add_array_datasets(Registry<DatasetFactory>& r);

}  // namespace trainer

# The two README commands. Everything else is plain CMake (see CMakePresets.json).
BUILD ?= build
JOBS ?= 2
RECIPE ?= recipes/fashion_mnist.toml
ARGS ?=
# Extra CMake arguments for the configure step (.ci/run: -DTRAINER_WERROR=ON).
CMAKE_ARGS ?=

.PHONY: run test build deps install-check clean

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake --preset default -B $(BUILD) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

run: build
	$(BUILD)/core/cli/trainer --recipe $(RECIPE) $(ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

clean:
	rm -rf $(BUILD)

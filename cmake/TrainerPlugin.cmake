# trainer_add_plugin(<name> SOURCES <src>... [NO_INSTALL] [OUTPUT_DIR <dir>])
#
# Builds a trainer plugin: a MODULE library named trainer_plugin_<name>.so linked to
# trainer::core (and so to the one LibTorch of the process). Inside the trainer build it
# lands in <build>/plugins, where the host finds it; out of tree it installs into
# <prefix>/lib/trainer/plugins unless NO_INSTALL is given.
function(trainer_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIR" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "trainer_add_plugin(${name}): SOURCES is required")
  endif()
  set(target trainer_plugin_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE trainer::core)
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  elseif(DEFINED TRAINER_BUILD_PLUGIN_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${TRAINER_BUILD_PLUGIN_DIR})
  endif()
  if(NOT ARG_NO_INSTALL AND DEFINED TRAINER_INSTALL_PLUGIN_DIR)
    install(TARGETS ${target} LIBRARY DESTINATION ${TRAINER_INSTALL_PLUGIN_DIR})
  endif()
endfunction()

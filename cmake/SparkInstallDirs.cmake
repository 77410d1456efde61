# Install layout (GNUInstallDirs: bin, include, lib or lib/<multiarch> under /usr, share). The
# installed programs find libspark relative to themselves ($ORIGIN/../lib), and libraries linked
# from outside the build and the system's default paths (CUDA's runtime in /usr/local/cuda) by
# their directory; a packager's -DCMAKE_INSTALL_RPATH=... replaces both.
include(GNUInstallDirs)
if(NOT DEFINED CMAKE_INSTALL_RPATH)
    if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
        set(CMAKE_INSTALL_RPATH "${CMAKE_INSTALL_LIBDIR}")
    else()
        file(RELATIVE_PATH spark_bin_to_lib "/prefix/${CMAKE_INSTALL_BINDIR}" "/prefix/${CMAKE_INSTALL_LIBDIR}")
        set(CMAKE_INSTALL_RPATH "$ORIGIN/${spark_bin_to_lib}")
    endif()
    set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)
endif()

# Conan 2 recipe for rpmapp, a header-only library. From a checkout:
#   conan create . --build=missing
# The version is read from meson.build, so there is one place to change it.
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


def meson_project_version(text):
    """The version: argument of project() in a meson.build text."""
    match = re.search(r"project\s*\((?:[^()]|\([^()]*\))*?\bversion\s*:\s*'([^']+)'", text)
    if not match:
        raise ValueError("no version in the project() call of meson.build")
    return match.group(1)


class RpmappConan(ConanFile):
    name = "rpmapp"
    description = ("Header-only C++20 RDMA connection management in the style of librpma: "
                   "rdma_cm with RAII types and expected errors")
    license = "BSD-3-Clause"
    topics = ("rdma", "rdma-cm", "librdmacm", "ibverbs", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # rdma-core builds librdmacm only on request
    default_options = {"rdma-core/*:build_librdmacm": True}
    exports_sources = "include/*", "LICENSE"
    no_copy_source = True

    def set_version(self):
        self.version = meson_project_version(
            load(self, os.path.join(self.recipe_folder, "meson.build")))

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        # rpmapp's headers include fmt and tl-expected and call librdmacm and libibverbs,
        # so the consumer needs their headers and libraries. Tested with fmt 9.1 and
        # tl-expected 1.0 (Debian 12).
        self.requires("fmt/[>=9.1 <12]", transitive_headers=True, transitive_libs=True)
        self.requires("tl-expected/[>=1.0 <2]", transitive_headers=True)
        self.requires("rdma-core/[>=44]", transitive_headers=True, transitive_libs=True)

    def package_id(self):
        self.info.clear()

    def validate(self):
        if self.settings.os != "Linux":
            raise ConanInvalidConfiguration("rpmapp needs rdma-core, which is Linux-only")
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        # the headers and their definitions (impl/*.ipp: included by the headers themselves
        # in header-only mode)
        for pattern in ("*.hpp", "*.ipp"):
            copy(self, pattern, os.path.join(self.source_folder, "include"),
                 os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "rpmapp")
        self.cpp_info.set_property("cmake_target_name", "rpmapp::rpmapp")
        self.cpp_info.set_property("pkg_config_name", "rpmapp")
        self.cpp_info.requires = ["fmt::fmt", "tl-expected::tl-expected",
                                  "rdma-core::librdmacm", "rdma-core::libibverbs"]

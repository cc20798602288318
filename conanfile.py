# Conan 2 recipe for rpmapp: header-only by default, or compiled (librpmapp, static or
# shared) with -o "rpmapp/*:header_only=False". From a checkout:
#   conan create . --build=missing [-o "rpmapp/*:header_only=False" [-o "rpmapp/*:shared=True"]]
# The version is read from meson.build, so there is one place to change it.
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load, rmdir
from conan.tools.gnu import PkgConfigDeps
from conan.tools.layout import basic_layout
from conan.tools.meson import Meson, MesonToolchain

required_conan_version = ">=2.0"


def meson_project_version(text):
    """The version: argument of project() in a meson.build text."""
    match = re.search(r"project\s*\((?:[^()]|\([^()]*\))*?\bversion\s*:\s*'([^']+)'", text)
    if not match:
        raise ValueError("no version in the project() call of meson.build")
    return match.group(1)


class RpmappConan(ConanFile):
    name = "rpmapp"
    description = ("Header-only or compiled C++20 RDMA connection management in the style of "
                   "librpma: rdma_cm with RAII types and expected errors")
    license = "BSD-3-Clause"
    topics = ("rdma", "rdma-cm", "librdmacm", "ibverbs", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # header_only=False: librpmapp, rpmapp's compiled mode (docs/packaging.md, "Header-only
    # or compiled"); shared and fPIC only mean something then
    options = {"header_only": [True, False], "shared": [True, False], "fPIC": [True, False]}
    # rdma-core builds librdmacm only on request
    default_options = {"header_only": True, "shared": False, "fPIC": True,
                       "rdma-core/*:build_librdmacm": True}
    # what Meson needs to build librpmapp (the headers alone for header-only)
    exports_sources = ("include/*", "LICENSE", "meson.build", "meson_options.txt", "src/*",
                       "packaging/*")
    no_copy_source = True

    def set_version(self):
        self.version = meson_project_version(
            load(self, os.path.join(self.recipe_folder, "meson.build")))

    def configure(self):
        if self.options.header_only:
            self.package_type = "header-library"
            self.options.rm_safe("shared")
            self.options.rm_safe("fPIC")
        else:
            self.package_type = "shared-library" if self.options.shared else "static-library"
            if self.options.shared:
                self.options.rm_safe("fPIC")

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        # rpmapp's headers include fmt and tl-expected and call librdmacm and libibverbs,
        # so the consumer needs their headers and libraries. Tested with fmt 9.1 and
        # tl-expected 1.0 (Debian 12).
        self.requires("fmt/[>=9.1 <12]", transitive_headers=True, transitive_libs=True)
        self.requires("tl-expected/[>=1.0 <2]", transitive_headers=True)
        self.requires("rdma-core/[>=44]", transitive_headers=True, transitive_libs=True)

    def build_requirements(self):
        if not self.options.header_only:
            self.tool_requires("meson/[>=1.0.0 <2]")
            self.tool_requires("pkgconf/[>=1.9 <3]")

    def package_id(self):
        if self.info.options.header_only:
            self.info.clear()

    def generate(self):
        if self.options.header_only:
            return
        tc = MesonToolchain(self)
        tc.project_options["library"] = "shared" if self.options.shared else "static"
        # librpmapp pins its expected back end for its users (package_info): tl-expected,
        # which every C++ standard from 20 on can use
        tc.project_options["expected_backend"] = "tl"
        for part in ("tests", "examples", "bench", "docs"):
            tc.project_options[part] = "disabled"
        tc.generate()
        PkgConfigDeps(self).generate()

    def build(self):
        if self.options.header_only:
            return
        meson = Meson(self)
        meson.configure()
        meson.build()

    def validate(self):
        if self.settings.os != "Linux":
            raise ConanInvalidConfiguration("rpmapp needs rdma-core, which is Linux-only")
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        if not self.options.header_only:
            Meson(self).install()
            # Conan's generators describe the package; Meson's own files would compete
            for generated in (os.path.join("lib", "pkgconfig"), os.path.join("share", "cmake"),
                              os.path.join("share", "pkgconfig"), os.path.join("share", "licenses")):
                rmdir(self, os.path.join(self.package_folder, generated))
            return
        # the headers and their definitions (impl/*.ipp: included by the headers themselves
        # in header-only mode)
        for pattern in ("*.hpp", "*.ipp"):
            copy(self, pattern, os.path.join(self.source_folder, "include"),
                 os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "rpmapp")
        self.cpp_info.set_property("cmake_target_name", "rpmapp::rpmapp")
        self.cpp_info.requires = ["fmt::fmt", "tl-expected::tl-expected",
                                  "rdma-core::librdmacm", "rdma-core::libibverbs"]
        # EventLoop::connect makes iWARP's blocking rdma_connect on a thread of its own
        self.cpp_info.system_libs = ["pthread"]
        if self.options.header_only:
            self.cpp_info.bindirs = []
            self.cpp_info.libdirs = []
            self.cpp_info.set_property("pkg_config_name", "rpmapp")
            return
        # as rpmapp-compiled.pc and rpmapp::compiled of rpmapp's own packaging
        self.cpp_info.libs = ["rpmapp"]
        self.cpp_info.defines = ["RPMAPP_SEPARATE_COMPILATION", "RPMAPP_USE_TL_EXPECTED=1"]
        self.cpp_info.set_property("cmake_target_aliases", ["rpmapp::compiled"])
        self.cpp_info.set_property("pkg_config_name", "rpmapp-compiled")

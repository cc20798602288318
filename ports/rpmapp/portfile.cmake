# vcpkg overlay port for rpmapp: builds the checkout this port lives in (ports/rpmapp/../..)
# with Meson. Use: vcpkg install rpmapp --overlay-ports=<checkout>/ports
# librdmacm and libibverbs come from the system: Debian/Ubuntu: apt install librdmacm-dev
# libibverbs-dev; Fedora: dnf install rdma-core-devel. vcpkg's rdma-core port is not
# declared on purpose: a program must use the same libibverbs as the other RDMA code in its
# process and a provider matching the machine's kernel (docs/packaging.md, "3. vcpkg").

# Feature "compiled": librpmapp (static or shared as the triplet links), built in debug and
# release. Without it rpmapp is header-only: one configuration is enough, nothing differs
# between debug and release.
if("compiled" IN_LIST FEATURES)
    if(VCPKG_LIBRARY_LINKAGE STREQUAL "dynamic")
        set(RPMAPP_LIBRARY shared)
    else()
        set(RPMAPP_LIBRARY static)
    endif()
else()
    set(RPMAPP_LIBRARY none)
    set(VCPKG_BUILD_TYPE release)
endif()

get_filename_component(SOURCE_PATH "${CURRENT_PORT_DIR}/../.." ABSOLUTE)

vcpkg_configure_meson(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -Dlibrary=${RPMAPP_LIBRARY}
        -Dexpected_backend=tl
        -Dtests=disabled
        -Dexamples=disabled
        -Dbench=disabled
        -Ddocs=disabled
)
vcpkg_install_meson()
if("compiled" IN_LIST FEATURES)
    # the debug build's headers and data duplicate the release build's
    file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug/include" "${CURRENT_PACKAGES_DIR}/debug/share")
endif()

# share/cmake/rpmapp -> share/rpmapp, with PACKAGE_PREFIX_DIR corrected for the move
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/rpmapp)
vcpkg_fixup_pkgconfig()

# the license goes to share/rpmapp/copyright instead of share/licenses/rpmapp
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/share/licenses")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")

# Installs the package's shared object (R's default), and, when configure built libfastpar
# from source, libfastpar and fastpar.h into the package's lib/ and include/:
# libs/fastpar.so finds lib/ through its relative rpath (configure).
files <- Sys.glob(paste0("*", SHLIB_EXT))
dest <- file.path(R_PACKAGE_DIR, paste0("libs", R_ARCH))
dir.create(dest, recursive = TRUE, showWarnings = FALSE)
file.copy(files, dest, overwrite = TRUE)
if (file.exists("symbols.rds")) file.copy("symbols.rds", dest, overwrite = TRUE)

prefix <- file.path("..", "tools", "fastpar", "build", "prefix")
if (dir.exists(file.path(prefix, "lib"))) {
  libs <- Sys.glob(file.path(prefix, "lib", c("libfastpar*.so*", "libfastpar*.dylib", "lib*ggml*", "lib*llama*")))
  dir.create(file.path(R_PACKAGE_DIR, "lib"), showWarnings = FALSE)
  dir.create(file.path(R_PACKAGE_DIR, "include"), showWarnings = FALSE)
  # llama.cpp is compiled into libfastpar: its licence goes with it.
  licence <- Sys.glob(file.path(prefix, "share", "doc", "fastpar", "LICENSE.llama.cpp"))
  stopifnot(all(file.copy(c(libs, licence), file.path(R_PACKAGE_DIR, "lib"), overwrite = TRUE)),
            all(file.copy(Sys.glob(file.path(prefix, "include", "*.h")), file.path(R_PACKAGE_DIR, "include"),
                          overwrite = TRUE)))
}

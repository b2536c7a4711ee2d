library(testthat)
library(fastpar)

test_check("fastpar")

/* SPDX-License-Identifier: MIT */
#include "config.h"
#include <criterion/criterion.h>
Test(wlink, placeholder) { cr_skip_test("filled by the wlink work"); }

/* A shared library without grove_plugin_entry. */
__attribute__((visibility("default"))) int some_other_library_function(void) { return 42; }

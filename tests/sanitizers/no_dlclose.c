/* Preloaded under the sanitizers: shared objects stay loaded until exit, so LeakSanitizer can
   name OpenMPI's plug-ins (MCA components, dlopen'ed and closed at MPI_Finalize) in its reports,
   and the suppressions in lsan.supp match them instead of an "<unknown module>". */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
